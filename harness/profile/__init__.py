"""Profiling of training runs: is the run input-bound, by how much, on which worker, and what to change.

  sampler  GPU (NVML) and CPU (psutil) utilization in a background thread, on the step timer's clock
  trace    tf.profiler step windows, one folder per worker, their check and the profiler's input analysis
  gather   every worker's part to the chief over the job's collectives (or MPI)
  report   report.json, the summary table, the verdict and advice; plot: the timeline PNG
  session  `ProfileSession`, which ties them to a `Trainer`
"""
