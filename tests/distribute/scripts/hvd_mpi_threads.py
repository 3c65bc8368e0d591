"""mpi4py beside Horovod's MPI controller in one rank, launched by tests/distribute/test_horovod_backend.py under
mpirun. Prints `HVD_THREADS {json}`.

  hvd_mpi_threads.py init       `horovod.init()`: the thread level granted, or the error it raised.
  hvd_mpi_threads.py stress N [SCALE]
                                N rounds of the control plane's collectives (pickled objects of 10 B to 64 KiB) on
                                the main thread while a second thread runs Horovod all-reduces, then an uneven
                                exit (rank 0 at once, the others after a pause): every round's values are checked.
                                With SCALE, between the rounds and the exit, hvd_loss_scale.py's step with that
                                fixed loss scale (its result under "loss_scale"): one mpirun for both.
"""
import json
import os
import random
import sys
import threading
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from harness.distribute import environment, horovod, mpi  # noqa: E402
from harness.errors import ClusterConfigError  # noqa: E402

rank = environment.read_launcher().rank
try:
    strategy, context = horovod.init()
except ClusterConfigError as e:
    print("HVD_THREADS " + json.dumps({"rank": rank, "error": str(e)}), flush=True)
    sys.exit(0)

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

plane = horovod.control_plane()
result = {"rank": context.rank, "level": mpi.thread_level_name(MPI.Query_thread()),
          "plane": type(plane).__name__, "own_comm": plane.comm != MPI.COMM_WORLD,
          "congruent": MPI.Comm.Compare(plane.comm, MPI.COMM_WORLD) == MPI.CONGRUENT}
if sys.argv[1] == "stress":
    rounds, stop, sums = int(sys.argv[2]), threading.Event(), []

    def allreduce_loop():  # until any rank's main loop is done: the flag travels in the sum, all stop together
        i, done = 0, 0.0
        while not done:
            got = hvd.allreduce(tf.concat([tf.fill([256], float(i)), [float(stop.is_set())]], 0), op=hvd.Sum,
                                name=f"threads.{i}").numpy()
            sums.append(bool((got[:256] == 2 * i).all()))  # 2 ranks
            i, done = i + 1, got[256]

    thread = threading.Thread(target=allreduce_loop)
    thread.start()
    rnd, wrong = random.Random(context.rank), []
    try:
        for i in range(rounds):
            mine = {"rank": context.rank, "round": i, "blob": "x" * rnd.randrange(10, 65536)}
            every = plane.allgather(mine)
            if [(e["rank"], e["round"], len(e["blob"])) for e in every] != [
                    (r, i, len(every[r]["blob"])) for r in range(plane.size)] or every[context.rank] != mine:
                wrong.append(i)
            if plane.bcast({"round": i, "blob": "y" * (i * 97 % 65536)}, root=0)["round"] != i:
                wrong.append(i)
            gathered = plane.gather(mine, root=0)
            if (gathered is None) != (context.rank != 0) or (gathered and gathered[context.rank] != mine):
                wrong.append(i)
    finally:
        stop.set()
        thread.join()
    result.update(rounds=rounds, wrong=wrong, allreduces=len(sums), allreduces_right=sum(sums))
    if len(sys.argv) > 3:
        import hvd_loss_scale  # tests/distribute/scripts, this script's folder

        result["loss_scale"] = hvd_loss_scale.step(strategy, context, float(sys.argv[3]))
    plane.bcast(None)  # both loops done everywhere before anyone leaves
    if context.rank:
        time.sleep(1.0)  # rank 0 exits (and shuts Horovod down everywhere) while this rank still runs Python
print("HVD_THREADS " + json.dumps(result), flush=True)
