"""Reads the TensorBoard event files of a directory with the tensorboard package's own loader and
prints their scalars as JSON: {tag: [[step, value], ...]}. Test-only: it is the independent reader
of what mltrain's TensorBoardLog writes.

    python tensorboard_read.py DIRECTORY
"""
import json
import pathlib
import sys

from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.util import tensor_util


def main():
    scalars = {}
    for path in sorted(pathlib.Path(sys.argv[1]).glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            # The loader migrates a scalar's simple_value into a one-element tensor, as
            # TensorBoard itself shows it.
            for value in event.summary.value:
                scalar = float(tensor_util.make_ndarray(value.tensor))
                scalars.setdefault(value.tag, []).append([event.step, scalar])
    print(json.dumps(scalars))


if __name__ == "__main__":
    main()
