"""Helpers for tests that write their own records: tf.train.Example from keyword values, and TFRecord files."""
import tensorflow as tf


def example(**features):
    """A tf.train.Example: bytes -> bytes_list, a list of ints -> int64_list, any other list -> float_list."""
    def feat(v):
        if isinstance(v, bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
        if v and isinstance(v[0], int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=v))
        return tf.train.Feature(float_list=tf.train.FloatList(value=v))
    return tf.train.Example(features=tf.train.Features(feature={k: feat(v) for k, v in features.items()}))


def write(path, examples, gz=False):
    """Write `examples` (Examples or raw bytes) to a TFRecord file at `path`, GZIP when `gz`; returns the path."""
    with tf.io.TFRecordWriter(str(path), "GZIP" if gz else "") as w:
        for ex in examples:
            w.write(ex if isinstance(ex, bytes) else ex.SerializeToString())
    return str(path)
