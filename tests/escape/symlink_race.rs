//! Sandboxed fs operations act on what they checked: symlink swaps cannot redirect them.
