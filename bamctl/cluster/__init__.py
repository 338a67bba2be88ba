"""Spreading one sweep over many processes: which slice each takes (``shards``), the sweep every
shard must agree on (``sweep``), and submitting the shards to Slurm or this machine (``submit``)."""
