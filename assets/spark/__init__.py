"""The Spark side of the maintenance pipeline: the data source that reads the runtime's tables and the
Bloom-filter building block of the blob GC."""
