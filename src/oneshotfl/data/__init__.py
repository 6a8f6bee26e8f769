"""Datasets, partitioners and the in-memory containers they produce."""

from oneshotfl.data.datasets import DATASETS, DatasetNotFoundError, list_datasets, load_dataset
from oneshotfl.data.partition import PARTITIONERS, PartitionError, class_counts, make_partitioner
from oneshotfl.data.types import Dataset, LabelledData, UnlabelledData

__all__ = [
    "DATASETS",
    "PARTITIONERS",
    "Dataset",
    "DatasetNotFoundError",
    "LabelledData",
    "PartitionError",
    "UnlabelledData",
    "class_counts",
    "list_datasets",
    "load_dataset",
    "make_partitioner",
]
