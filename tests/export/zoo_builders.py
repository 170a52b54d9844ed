"""torchvision models with what psd draws itself switched off, for
tests/export/check_resnet.py (psd-export takes them as FILE.py:NAME): psd
draws its own dropout masks, so a training forward equals PyTorch's only
with dropout off, and these builders have no argument for it."""
import torchvision


def efficientnet_b0(**kwargs):
    """efficientnet_b0 with its classifier's Dropout at p 0 (stochastic_depth_prob is an argument)."""
    m = torchvision.models.efficientnet_b0(**kwargs)
    m.classifier[0].p = 0.0
    return m


def efficientnet_v2_s(**kwargs):
    """efficientnet_v2_s with its classifier's Dropout at p 0."""
    m = torchvision.models.efficientnet_v2_s(**kwargs)
    m.classifier[0].p = 0.0
    return m
