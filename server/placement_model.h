/* placement_model.h - the model options of what this psd hosts: psd's half
 * of the placement (common/placement.h knows no server module; this one
 * fills server/nn/model.h's ps_model_opts from the config and the
 * resolved placement).
 */
#ifndef PS_PLACEMENT_MODEL_H
#define PS_PLACEMENT_MODEL_H

#include "config.h"
#include "model.h"
#include "placement.h"
#include "status.h"

/* The options of the model this process hosts (psd): model.* and
 * optimizer.*, server.compute_threads (0: the online CPUs), and - for a
 * cluster's server (c->self >= 0) - only the stages and shard rows placed
 * on it, each on its placement's device, resolved into p. mo points into c
 * and p: keep both alive while mo is used. INVALID_ARGUMENT when the server
 * hosts no stage, or shards of two stages. */
ps_status ps_placement_model_opts(const ps_config *c, ps_placement *p, ps_model_opts *mo, ps_err *err);

#endif
