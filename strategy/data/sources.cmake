# The tf.data-like input pipeline (include/tributary/strategy/dataset.h).
target_sources(tributary_strategy PRIVATE
  data/auto_shard.cc
  data/compose.cc
  data/crc32c.cc
  data/csv.cc
  data/dataset.cc
  data/files.cc
  data/prefetch.cc
  data/rebatch.cc
  data/sources.cc
  data/transforms.cc)
