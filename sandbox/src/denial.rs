//! `sandboxDenied` for sandboxed processes (SANDBOX.md §8.5, PROTOCOL §4.11): a heuristic
//! over the exit code and the retained output, with the reference classifier's keywords
//! and rule order.

/// Output phrases that indicate the sandbox refused something (compared case-insensitively).
const KEYWORDS: &[&str] = &[
    "operation not permitted",
    "permission denied",
    "read-only file system",
    "seccomp",
    "sandbox",
    "landlock",
    "failed to write file",
];

/// 128 + SIGSYS: killed by the seccomp architecture check.
const SIGSYS_EXIT: i32 = 128 + 31;

/// Classifies an exit. `enforced` is false for `sandboxType: "none"`; `output` is every
/// retained chunk of every stream, concatenated in `seq` order.
pub fn sandbox_denied(enforced: bool, exit_code: i32, output: &[u8]) -> bool {
    if !enforced || exit_code == 0 {
        return false;
    }
    let text = String::from_utf8_lossy(output).to_lowercase();
    if KEYWORDS.iter().any(|k| text.contains(k)) {
        return true;
    }
    if matches!(exit_code, 2 | 126 | 127) {
        return false;
    }
    exit_code == SIGSYS_EXIT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_table() {
        assert!(!sandbox_denied(true, 0, b"permission denied"));
        assert!(sandbox_denied(true, 1, b"Operation not permitted"));
        assert!(!sandbox_denied(true, 127, b""));
        assert!(sandbox_denied(true, 127, b"permission denied"));
        assert!(!sandbox_denied(true, 2, b""));
        assert!(sandbox_denied(true, 159, b""));
        assert!(!sandbox_denied(true, 1, b""));
        assert!(!sandbox_denied(false, 1, b"permission denied"));
        // A keyword split across two chunks still counts once they are concatenated.
        let chunks: [&[u8]; 2] = [b"sh: x: Permission de", b"nied\n"];
        assert!(sandbox_denied(true, 1, &chunks.concat()));
    }
}
