"""Error types the user can catch. Every message names the file, record index and feature where they apply.

All derive from `HarnessError`, so `except HarnessError` catches any input or configuration problem the harness
detected before or during training.
"""


class HarnessError(Exception):
    """Base class of every error the harness raises on purpose."""


# --- data: shards and files -------------------------------------------------------------------------------------
class ShardDiscoveryError(HarnessError):
    """No shard matched the given folder, glob or paths, or a path does not exist."""


class MissingShardError(ShardDiscoveryError):
    """A numeric shard index is missing from a sequence (00000, 00001, 00003: 00002 lost)."""


class ShardConflictError(ShardDiscoveryError):
    """Two shard sets share a prefix: names declare different totals (`-of-00002` and `-of-00003`), or one index
    appears in two files."""


class CompressionMismatchError(HarnessError):
    """A file's bytes disagree with the compression it was declared with (GZIP read as uncompressed or reverse)."""


class NotTFRecordError(HarnessError):
    """A file is not TFRecord framing (bad length or CRC in its first record)."""


class TruncatedShardError(HarnessError):
    """A shard ends in the middle of a record; the message gives the last good record index."""


class CorruptShardError(HarnessError):
    """A record's CRC or the GZIP stream is corrupt; the message gives the last good record index."""


class NotExampleError(HarnessError):
    """Records are not tf.train.Example (a SequenceExample or another protobuf)."""


class MixerError(HarnessError):
    """mixer.json is missing where required, malformed, or disagrees with the shards (totalPatches vs records)."""


class CacheInUseError(HarnessError):
    """A file cache (--cache file) is being filled by another live process; the message names the cache and the
    owner's pid and host."""


# --- data: feature spec -----------------------------------------------------------------------------------------
class SpecError(HarnessError):
    """A feature spec or config is malformed (unknown dtype, label not declared, patch shape impossible)."""


class SpecMismatchError(SpecError):
    """A record disagrees with the declared spec: base of the specific mismatches below."""


class MissingFeatureError(SpecMismatchError):
    """A declared feature is absent from a record; the message names the closest available key."""


class FeatureDtypeError(SpecMismatchError):
    """A feature is stored with another dtype than declared (label declared int64, stored float)."""


class FeatureLengthError(SpecMismatchError):
    """A feature has another number of values than declared (256 values where a 4x4 patch was declared)."""


class EmptyFeatureError(SpecMismatchError):
    """A declared feature is present but holds no values."""


class LabelValueError(SpecMismatchError):
    """A classification label holds a value that is not a class id in [0, num_classes) (negative, fractional, NaN,
    or beyond the classes); the message names the file, record and value."""


class SchemaDriftError(SpecMismatchError):
    """Shards of one dataset have different schemas (feature names or dtypes)."""


# --- distribution and batching ----------------------------------------------------------------------------------
class ClusterConfigError(HarnessError):
    """TF_CONFIG or launcher variables are malformed, inconsistent, or set too late for the strategy."""


class BatchSizeError(HarnessError):
    """Batch sizes are inconsistent (global not divisible by replicas), or an epoch would have zero steps."""


# --- training ---------------------------------------------------------------------------------------------------
class NonFiniteLossError(HarnessError):
    """The loss became NaN or infinite; the message gives the step number."""


class LossScaleError(HarnessError):
    """Under loss scaling, updates kept being skipped (gradients not finite) with the loss scale at its floor; the
    message gives the step and how many steps applied an update."""


class WorkerFailedError(HarnessError):
    """A worker process exited non-zero or did not arrive in time; the message names the worker.

    `exit_code`: what a `harness` command exits with on it (`harness.cli`): 2 (permanent) unless a launcher passes
    on the code of the worker that failed first (`harness.launch.stopping.launcher_code`), e.g. 138 or 137."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


# --- faults of the cluster: retryable (exit 138, `harness.exit_codes`) -----------------------------------------
class ClusterFault(HarnessError):
    """A fault of the cluster, not of the input or configuration: a re-run of the same command resumes from the
    last backup. `harness` commands exit with `harness.exit_codes.RETRYABLE` (138) on it, a code Kubernetes'
    training-operator retries. The message is one line naming the worker (or rank), its host, the step and the
    backup a re-run resumes from."""


class PeerLostError(ClusterFault):
    """A peer worker or rank is gone (its process ended, its host or link is down) or did not arrive within the
    peer wait."""


class StorageError(ClusterFault):
    """Cloud Storage failed a read or write after TensorFlow's own retries (HTTP 429 rate and egress limits, 503,
    requests stalled at 0 bytes): the message names the object, the worker, its host and the step, never a peer."""


class StalledWorkerError(ClusterFault):
    """A worker is alive but made no step progress within the step-progress bound (a stuck read, a hung
    collective); the message names the stuck worker where it is known."""


class PreemptedError(ClusterFault):
    """SIGTERM arrived (a Kubernetes eviction or preemption, a launcher's stop): every worker wrote a backup at the
    same step boundary and stopped; the message gives the step and the backup."""


class RepeatedFaultError(HarnessError):
    """What looked like a lost peer came back after the same step on the attempt that resumed before it (or is
    protobuf's message size limit): a retry cannot help, so the exit is permanent; the message names both causes."""


class AttemptsExhaustedError(HarnessError):
    """Attempts past `HARNESS_MAX_ATTEMPTS` started from the same backup step (a pod recreated on every 137 or
    138): the retryable fault is made permanent (`harness.train.lifecycle.attempts`); the message gives the
    attempt, the limit, the step and the fault."""


class ConfigError(HarnessError):
    """A run config (YAML or flags) has unknown keys, missing required values or values of the wrong type."""


# --- prediction -------------------------------------------------------------------------------------------------
class PredictError(HarnessError):
    """`harness predict` cannot run as asked: base of the prediction errors below."""


class ModelMismatchError(PredictError):
    """The model and the export disagree (other bands, another patch size or kernel margin, an input or output
    whose spatial size is neither the stored nor the cropped patch, an odd kernel margin); raised before any
    prediction, naming the model, the export's file and what each holds."""


class OutputExistsError(PredictError):
    """The output folder holds files of another run (other data, model or options) or files that are not
    predictions; refused unless `--overwrite`."""


# --- user code: models and losses -------------------------------------------------------------------------------
class UserCodeError(HarnessError):
    """A user's function (`--model`, `--loss MODULE:FUNCTION`) cannot be imported or is not usable as given: the
    message names the module and the import error, or what the object is and what the harness expects (a Keras 3
    object where the harness runs tf_keras, a pre-built optimizer, a loss that returns a scalar)."""


class ModelError(HarnessError):
    """A user's model does not fit the data: its output does not fit the labels or the classes, it is not float32
    under a mixed policy (naming the layer), or `--init-from` weights match none of its layers."""


class ModelFileError(ModelError, PredictError):
    """`--init-from` or `predict --model` names neither a `.keras` file nor a run folder holding `model.keras`
    (`harness.run_folder.find_model`); the message names the flag and the path looked for. One type for
    both commands, caught as either's error (ModelError, PredictError)."""
