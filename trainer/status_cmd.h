/* status_cmd.h - `ps-train status`: ask a running psd for its Status and
 * print it for people (docs/operations.md, "Status for humans"). */
#ifndef PS_STATUS_CMD_H
#define PS_STATUS_CMD_H

/* argv[0] is "status"; returns the process exit code: 0 when psd answered,
 * 1 when it could not be reached or refused, 2 for bad flags. Call between
 * grpc_init() and grpc_shutdown() is done here. */
int ps_status_cmd_main(int argc, char **argv);

#endif
