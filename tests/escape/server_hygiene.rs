//! The server keeps its secrets out of its environment, its logs, its answers and its dumps.
