#!/bin/sh
# The hidden check, run on the host after the run, in the workspace as the run left it:
# the visible tests as they were given (a changed test does not count) and cases the
# agent never saw. $TASK is this task's directory, $PYTHON a Python with pytest.
set -e
cd "$1"
cp "$TASK"/workspace/test_*.py .
cp "$TASK"/hidden/*.py .
exec "$PYTHON" -m pytest -q -p no:cacheprovider
