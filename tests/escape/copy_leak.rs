//! Recursive `fs/copy` and the other recursive operations never hand out what the policy denies.
