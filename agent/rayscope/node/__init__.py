"""The node agent: one node's report built from the sources, `push` that sends it, CUDA
samples, and the agents placed through Ray."""
