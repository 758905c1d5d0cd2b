"""What reads a cluster for someone else: the Python API (`rayscope.cluster_state`, `fit`,
`usage`) and the client side of the head's HTTP port (`status --head`, `fit --head`,
`usage --head`): the request, its deadline and bounds, and what answers at a port that
speaks something else."""
