"""Where rayscope writes besides stdout: files on a shared host, and the daemons' log lines."""
