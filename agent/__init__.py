"""rayscope: booked vs measured GPU state of a Ray cluster, per node and rolled up."""

__version__ = "0.1.0"
