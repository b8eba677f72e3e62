"""The gateway: the cluster's one HTTP endpoint."""
