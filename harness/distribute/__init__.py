"""Who am I in this job, how the data is split, and how batch sizes relate: worker context, strategies, sharding,
batch arithmetic."""
