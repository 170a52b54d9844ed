# psd@.service, the template unit for one server of a cluster with several
# PS nodes (README, "Several PS nodes"), made from psd.service.in by
# `make install`: `systemctl enable --now psd@ps0` runs
# `psd --config /etc/psd/cluster.yaml --name ps0`; its checkpoint parts go
# to server.checkpoint_dir/ps0 (e.g. /var/lib/psd/ps0).
s|^# psd.service - the psd parameter server as a systemd service.|# psd@.service - one server (servers.%i) of a psd cluster as a systemd service.|
s|^# `make install` writes it to $(SYSTEMDUNITDIR)/psd.service with the paths|# `make install` writes it to $(SYSTEMDUNITDIR)/psd@.service with the paths|
s|^Description=.*|Description=psd parameter server %i of a cluster (servers.%i of cluster.yaml)|
s|^ExecStart=\(.*\)/psd --config \(.*\)/psd/psd.yaml$|ExecStart=\1/psd --config \2/psd/cluster.yaml --name %i|
