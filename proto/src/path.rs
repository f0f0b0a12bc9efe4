//! Paths on the wire (PROTOCOL §5.1): `file:` URIs and native absolute paths in, canonical
//! `file:` URIs out. Unix paths are byte strings, so both directions are byte-exact.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::error::{foreign_os_reason, RpcError};

/// Why a wire path was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathError {
    /// Not an acceptable path at all (-32602 `invalid path`); the text is the reason.
    Invalid(String),
    /// A well-formed `file:` URI in another OS's convention (-32600, §5.1).
    ForeignOs(String),
}

impl PathError {
    /// The reason text, as used inside other messages (e.g. the `cwd` error).
    pub fn reason(&self) -> &str {
        match self {
            Self::Invalid(r) | Self::ForeignOs(r) => r,
        }
    }

    /// The error an `fs/*` path member answers with.
    pub fn into_rpc(self, value: &str) -> RpcError {
        match self {
            Self::Invalid(reason) => RpcError::invalid_path(value, reason),
            Self::ForeignOs(_) => RpcError::foreign_os_uri(value),
        }
    }
}

/// Whether `value` starts with the `file:` scheme, in any case. Compares bytes: client text
/// need not have a character boundary at byte 5 (`"ab😀"`).
pub fn has_file_scheme(value: &str) -> bool {
    value
        .as_bytes()
        .get(..5)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case(b"file:"))
}

/// Parses a wire path: a `file:` URI or a native absolute path.
pub fn parse_path(value: &str) -> Result<PathBuf, PathError> {
    if value.is_empty() {
        return Err(PathError::Invalid("path must not be empty".into()));
    }
    if has_file_scheme(value) {
        return parse_file_uri(value);
    }
    if value.starts_with('/') {
        return Ok(PathBuf::from(value));
    }
    if let Some((scheme, _)) = value.split_once(':') {
        let is_scheme = !scheme.is_empty()
            && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if is_scheme && scheme.len() > 1 {
            return Err(PathError::Invalid(format!(
                "unsupported URI scheme `{scheme}`; expected a file: URI or an absolute path"
            )));
        }
    }
    Err(PathError::Invalid(
        "relative paths are not accepted; expected a file: URI or an absolute path".into(),
    ))
}

fn parse_file_uri(value: &str) -> Result<PathBuf, PathError> {
    let rest = &value[5..];
    if rest.contains('?') {
        return Err(PathError::Invalid("file URIs must not have a query".into()));
    }
    if rest.contains('#') {
        return Err(PathError::Invalid(
            "file URIs must not have a fragment".into(),
        ));
    }
    let raw_path = match rest.strip_prefix("//") {
        Some(after) => {
            let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
            if authority.contains('@') {
                return Err(PathError::Invalid(
                    "file URIs must not carry user information".into(),
                ));
            }
            if authority.contains(':') {
                return Err(PathError::Invalid("file URIs must not have a port".into()));
            }
            if !authority.is_empty() && !authority.eq_ignore_ascii_case("localhost") {
                return Err(PathError::Invalid(format!(
                    "file URI host `{authority}` is not supported; only an empty host or localhost"
                )));
            }
            path
        }
        None => rest,
    };
    if !raw_path.starts_with('/') {
        return Err(PathError::Invalid(
            "file URI must contain an absolute path".into(),
        ));
    }
    // Split before percent-decoding, so an encoded `/` (`%2F`) never takes part in
    // resolving `.` and `..`.
    let segments = raw_path[1..]
        .split('/')
        .map(percent_decode)
        .collect::<Result<Vec<_>, _>>()?;
    if is_drive_letter(&segments[0]) {
        return Err(PathError::ForeignOs(foreign_os_reason(value)));
    }
    Ok(PathBuf::from(OsString::from_vec(remove_dot_segments(
        &segments,
    ))))
}

fn percent_decode(s: &str) -> Result<Vec<u8>, PathError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| PathError::Invalid("invalid percent-encoding in file URI".into()))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    if out.contains(&0) {
        return Err(PathError::Invalid(
            "path must not contain a NUL byte".into(),
        ));
    }
    Ok(out)
}

/// True when the first name of `path` (bytes) reads as a drive letter.
fn starts_like_drive(path: &[u8]) -> bool {
    let names = path.strip_prefix(b"/").unwrap_or(path);
    let first = names.split(|b| *b == b'/').next().unwrap_or_default();
    is_drive_letter(first)
}

/// `C:` or `c|` (the first segment of `/C:/…`): a Windows drive letter.
fn is_drive_letter(first: &[u8]) -> bool {
    first.len() == 2 && first[0].is_ascii_alphabetic() && matches!(first[1], b':' | b'|')
}

/// RFC 3986 §5.2.4 on the decoded segments of an absolute path: `.` segments vanish, `..`
/// removes its parent (never above the root). `%2E` counts as `.`, as in URI normalisation.
fn remove_dot_segments(decoded: &[Vec<u8>]) -> Vec<u8> {
    let mut segments: Vec<&[u8]> = Vec::new();
    let mut trailing_slash = false;
    for segment in decoded {
        trailing_slash = false;
        match segment.as_slice() {
            b"." => trailing_slash = true,
            b".." => {
                segments.pop();
                trailing_slash = true;
            }
            other => segments.push(other),
        }
    }
    let mut out = Vec::with_capacity(decoded.iter().map(|s| s.len() + 1).sum());
    for segment in &segments {
        out.push(b'/');
        out.extend_from_slice(segment);
    }
    if out.is_empty() || (trailing_slash && !out.ends_with(b"/")) {
        out.push(b'/');
    }
    out
}

/// The canonical `file:` URI encoding of an absolute path (§5.1): every byte outside the
/// URL path character set is percent-encoded; never `localhost`. It does not always name
/// the same file: a `..` name reads as a dot segment, a first name `C:` as a drive. Every
/// name the server hands out goes through [`to_file_uri`] instead.
pub fn encode_file_uri(path: &Path) -> String {
    let bytes = path.as_os_str().as_bytes();
    let mut out = String::with_capacity(7 + bytes.len());
    out.push_str("file://");
    for &b in bytes {
        if is_path_char(b) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
    out
}

/// The `file:` URI of `path` (absolute) that [`parse_path`], and any RFC 3986 reader,
/// turns back into exactly the bytes of `path`: the name of every path the server returns
/// or hands to another process. That is the canonical form ([`encode_file_uri`]) unless a
/// `.` or `..` name in `path` would be resolved as a dot segment (the kernel resolves
/// `..` through links, a URI reader lexically), or a first name such as `C:` would read as
/// another OS's drive letter; then every `/` after the first is percent-encoded too, so
/// the names form one segment that nothing resolves, behind a `.` segment that keeps it
/// from being the first. Only `/.` and `/..` have no such URI (they are UTF-8 and sent
/// natively, see [`to_wire_path`]).
pub fn to_file_uri(path: &Path) -> String {
    let canonical = encode_file_uri(path);
    let bytes = path.as_os_str().as_bytes();
    let plain = !bytes.windows(2).any(|w| w == b"/." || w == b"//") && !starts_like_drive(bytes);
    if plain {
        return canonical;
    }
    let round_trips = parse_path(&canonical)
        .is_ok_and(|parsed| parsed.as_os_str().as_bytes() == path.as_os_str().as_bytes());
    if round_trips {
        return canonical;
    }
    let names = canonical["file://".len()..]
        .strip_prefix('/')
        .unwrap_or(&canonical["file://".len()..]);
    format!("file:///./{}", names.replace('/', "%2F"))
}

/// The text that names `path` (absolute) exactly for a peer that reads it with
/// [`parse_path`], such as the fs helper (SANDBOX.md §4.4): the native path when it is
/// UTF-8, so that `..` keeps the kernel's meaning; otherwise [`to_file_uri`].
pub fn to_wire_path(path: &Path) -> String {
    match path.to_str() {
        Some(text) => text.to_owned(),
        None => to_file_uri(path),
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn is_path_char(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
                | b'/'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Vec<u8> {
        parse_path(s).unwrap().into_os_string().into_vec()
    }

    #[test]
    fn accepts_both_forms() {
        assert_eq!(ok("file:///tmp/x"), b"/tmp/x");
        assert_eq!(ok("FILE://localhost/tmp/x"), b"/tmp/x");
        assert_eq!(ok("file:///tmp/a%20b/%FF"), b"/tmp/a b/\xff");
        assert_eq!(ok("file:///tmp/./a/../b"), b"/tmp/b");
        assert_eq!(ok("file:///../.."), b"/");
        assert_eq!(ok("/tmp/./x/../y"), b"/tmp/./x/../y");
        assert_eq!(ok("file:///tmp/x/"), b"/tmp/x/");
        assert_eq!(ok("file:///tmp/x/.."), b"/tmp/");
        assert_eq!(ok("file:///tmp/%2e%2E/x/%2E"), b"/x/");
        assert_eq!(ok("file:///a/b%2F..%2Fc"), b"/a/b/../c");
        assert_eq!(ok("file:///"), b"/");
    }

    #[test]
    fn rejects_bad_forms() {
        for bad in [
            "",
            "src/main.rs",
            "./x",
            "http://x/y",
            "file://host/x",
            "file://u@localhost/x",
            "file://localhost:80/x",
            "file:///x?q",
            "file:///x#f",
            "file:///x%zz",
            "file:///x%00",
        ] {
            assert!(
                matches!(parse_path(bad), Err(PathError::Invalid(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_path("file:///c%7C/x"),
            Err(PathError::ForeignOs(_))
        ));
        assert_eq!(
            parse_path("file:///C:/Users/x"),
            Err(PathError::ForeignOs(
                "'file:///C:/Users/x' is invalid on 'linux'".into()
            ))
        );
    }

    #[test]
    fn formats_canonical_uris() {
        let p = PathBuf::from(OsString::from_vec(b"/tmp/a b#?%/\xff\xc3\xa9".to_vec()));
        let uri = to_file_uri(&p);
        assert_eq!(uri, "file:///tmp/a%20b%23%3F%25/%FF%C3%A9");
        assert_eq!(parse_path(&uri).unwrap(), p);
    }

    /// The round trip the `paths` fuzz target checks: a non-UTF-8 path holding `..` (from
    /// `%2F..%2F`) went to the fs helper as a canonical URI, whose dot segments the helper
    /// resolved lexically; and a first name `C:` made the helper's policy unreadable. Names
    /// the server returns (walks, watches, searches) are made the same way, so a client's
    /// URI reader never resolves a `..` that the kernel resolved through a link.
    #[test]
    fn exact_uris_and_wire_paths_name_exactly_their_path() {
        let bytes = |p: &[u8]| PathBuf::from(OsString::from_vec(p.to_vec()));
        for path in [
            bytes(b"/a/link/../\xff"),
            bytes(b"/a/./\xff/."),
            bytes(b"/C:/x"),
            bytes(b"/c|"),
            bytes(b"/C:/\xff/.."),
            bytes(b"//a//\xff/"),
            bytes(b"/tmp/a b/\xff"),
            bytes(b"/"),
        ] {
            let exact = to_file_uri(&path);
            let parsed = parse_path(&exact).unwrap_or_else(|e| panic!("{exact}: {e:?}"));
            assert_eq!(
                parsed.as_os_str().as_bytes(),
                path.as_os_str().as_bytes(),
                "{exact}"
            );
            let wire = to_wire_path(&path);
            let parsed = parse_path(&wire).unwrap_or_else(|e| panic!("{wire}: {e:?}"));
            assert_eq!(
                parsed.as_os_str().as_bytes(),
                path.as_os_str().as_bytes(),
                "{wire}"
            );
        }
        // Paths that round-trip keep the canonical form.
        let plain = bytes(b"/tmp/a b/\xff");
        assert_eq!(to_file_uri(&plain), encode_file_uri(&plain));
        assert_eq!(to_file_uri(&bytes(b"/tmp/.a/..b")), "file:///tmp/.a/..b");
        assert_eq!(to_file_uri(&bytes(b"/C:/x")), "file:///./C:%2Fx");
        assert_eq!(
            to_file_uri(&bytes(b"/ws/link/../x")),
            "file:///./ws%2Flink%2F..%2Fx"
        );
        assert_eq!(to_wire_path(Path::new("/a/../b")), "/a/../b");
    }
}
