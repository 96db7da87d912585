#!/usr/bin/env bash
# NVIDIA's name for the preprocessing entry: runs preproc/prepare_dataset.sh with the same arguments.
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/preproc/prepare_dataset.sh" "$@"
