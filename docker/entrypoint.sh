#!/bin/sh
# Runs `pe-export ARGS` and hands its exit code to `docker run` (0 pass, 1 parity failure,
# 2 bad input, 3 runtime unavailable): exec replaces the shell, so nothing swallows it.
set -eu
exec pe-export "$@"
