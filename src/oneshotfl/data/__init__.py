"""Datasets, partitioners and the in-memory containers they produce."""

from oneshotfl.data import partition_sets  # noqa: F401  (registers pathological, disjoint)
from oneshotfl.data.datasets import (
    DATASETS,
    DatasetFormatError,
    DatasetNotFoundError,
    list_datasets,
    load_dataset,
)
from oneshotfl.data.partition import (
    PARTITIONERS,
    Partitioner,
    PartitionError,
    class_counts,
    make_partitioner,
)
from oneshotfl.data.types import Dataset, LabelledData, UnlabelledData
from oneshotfl.data.user import UserDataError, UserDataNotFoundError, is_user_spec

__all__ = [
    "DATASETS",
    "PARTITIONERS",
    "Dataset",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "LabelledData",
    "PartitionError",
    "Partitioner",
    "UnlabelledData",
    "UserDataError",
    "UserDataNotFoundError",
    "class_counts",
    "is_user_spec",
    "list_datasets",
    "load_dataset",
    "make_partitioner",
]
