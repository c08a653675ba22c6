//! The file ops: `read_file`, `write_file`, `edit_file` and `list_dir`, all confined to the
//! workspace by [`Workspace`].

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;

use rustix::fs::{AtFlags, Dir, FileType};

use crate::confine::{Access, Workspace};
use crate::error::Error;
use crate::limits::Limits;
use crate::output::char_boundary_before_end;
use crate::protocol::{
    DirEntry, EditFileOutput, EditFileRequest, EntryKind, ListDirOutput, ListDirRequest,
    ReadFileOutput, ReadFileRequest, WriteFileOutput, WriteFileRequest,
};

/// How much of a file's start is searched for a NUL byte to call it binary, like git does.
pub(crate) const BINARY_PROBE_BYTES: usize = 8192;

pub(crate) fn read_file(
    workspace: &Workspace,
    limits: &Limits,
    request: &ReadFileRequest,
) -> Result<ReadFileOutput, Error> {
    let path = request.path.as_str();
    let opened = workspace.open_file(path, Access::Read)?;
    let read_error = |e| Error::io("cannot read", path, e);
    let mut reader = BufReader::with_capacity(64 * 1024, opened.file);
    if reader
        .fill_buf()
        .map_err(read_error)?
        .iter()
        .take(BINARY_PROBE_BYTES)
        .any(|&b| b == 0)
    {
        return Err(Error::Binary {
            path: path.to_owned(),
        });
    }
    let offset = request.offset.unwrap_or(0);
    let limit = request.limit.unwrap_or(limits.read_lines);
    let budget = limits.max_read_bytes;
    let mut output = ReadFileOutput {
        content: String::new(),
        lines: 0,
        size: opened.size,
        next_offset: None,
        note: None,
    };

    let mut skipped = 0;
    while skipped < offset && read_line(&mut reader, 0).map_err(read_error)?.is_some() {
        skipped += 1;
    }
    if skipped < offset {
        output.note = Some(format!(
            "offset {offset} is past the end of the file ({skipped} lines)"
        ));
        return Ok(output);
    }

    let mut content = Vec::new();
    let mut more = false;
    while output.lines < limit {
        let room = budget - content.len();
        let Some(line) = read_line(&mut reader, room + 1).map_err(read_error)? else {
            break;
        };
        if line.total <= room as u64 {
            content.extend_from_slice(&line.kept);
            output.lines += 1;
            continue;
        }
        if output.lines == 0 {
            // A single line longer than the whole budget: show its start rather than nothing.
            let cut = char_boundary_before_end(&line.kept[..room]);
            content.extend_from_slice(&line.kept[..cut]);
            output.lines = 1;
            output.note = Some(format!(
                "line {} is {} bytes long; only its first {cut} bytes are shown",
                offset + 1,
                line.total
            ));
            more = !reader.fill_buf().map_err(read_error)?.is_empty();
        } else {
            output.note = Some(format!(
                "stopped after {} lines: the response limit is {budget} bytes",
                output.lines
            ));
            more = true;
        }
        break;
    }
    if output.lines == limit && output.note.is_none() {
        more = !reader.fill_buf().map_err(read_error)?.is_empty();
    }
    output.next_offset = more.then_some(offset + output.lines);
    output.content = String::from_utf8_lossy(&content).into_owned();
    Ok(output)
}

/// One line read by [`read_line`]: its first bytes (up to the caller's `keep`) and its full
/// length, newline included.
#[derive(Debug)]
pub(crate) struct Line {
    pub(crate) kept: Vec<u8>,
    pub(crate) total: u64,
}

/// Reads one line, keeping at most `keep` bytes of it, so a gigabyte without a newline costs
/// no memory. `None` at end of file.
pub(crate) fn read_line(reader: &mut impl BufRead, keep: usize) -> std::io::Result<Option<Line>> {
    let mut line = Line {
        kept: Vec::new(),
        total: 0,
    };
    // Ends: each pass consumes what `fill_buf` gave, until a newline or end of file.
    loop {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            return Ok((line.total > 0).then_some(line));
        }
        let (length, done) = match buffer.iter().position(|&b| b == b'\n') {
            Some(newline) => (newline + 1, true),
            None => (buffer.len(), false),
        };
        let take = length.min(keep - line.kept.len());
        line.kept.extend_from_slice(&buffer[..take]);
        line.total += length as u64;
        reader.consume(length);
        if done {
            return Ok(Some(line));
        }
    }
}

pub(crate) fn write_file(
    workspace: &Workspace,
    limits: &Limits,
    request: &WriteFileRequest,
) -> Result<WriteFileOutput, Error> {
    let path = request.path.as_str();
    let size = request.content.len() as u64;
    if size > limits.max_file_bytes {
        return Err(Error::TooLarge {
            path: path.to_owned(),
            size,
            limit: limits.max_file_bytes,
        });
    }
    let mut opened = workspace.open_file(path, Access::Create)?;
    let write_error = |e| Error::io("cannot write", path, e);
    opened.file.set_len(0).map_err(write_error)?;
    opened
        .file
        .write_all(request.content.as_bytes())
        .map_err(write_error)?;
    Ok(WriteFileOutput {
        bytes: size,
        created: opened.created,
    })
}

pub(crate) fn edit_file(
    workspace: &Workspace,
    limits: &Limits,
    request: &EditFileRequest,
) -> Result<EditFileOutput, Error> {
    let path = request.path.as_str();
    if request.old_text.is_empty() {
        return Err(Error::Invalid(format!("old_text is empty for {path}")));
    }
    let opened = workspace.open_file(path, Access::ReadWrite)?;
    let limit = limits.max_file_bytes;
    if opened.size > limit {
        return Err(Error::TooLarge {
            path: path.to_owned(),
            size: opened.size,
            limit,
        });
    }
    let mut bytes = Vec::new();
    // `take` guards against a file that grows between fstat and read.
    (&opened.file)
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("cannot read", path, e))?;
    if bytes.len() as u64 > limit {
        return Err(Error::TooLarge {
            path: path.to_owned(),
            size: bytes.len() as u64,
            limit,
        });
    }
    if bytes.iter().take(BINARY_PROBE_BYTES).any(|&b| b == 0) {
        return Err(Error::Binary {
            path: path.to_owned(),
        });
    }
    let text = String::from_utf8(bytes).map_err(|_| Error::NotUtf8 {
        path: path.to_owned(),
    })?;
    let count = text.matches(request.old_text.as_str()).count() as u64;
    if count == 0 {
        return Err(Error::NoMatch {
            path: path.to_owned(),
            hint: crate::closest::hint(&text, &request.old_text),
        });
    }
    if count > 1 && !request.replace_all {
        return Err(Error::AmbiguousMatch {
            path: path.to_owned(),
            count,
        });
    }
    let edited = if request.replace_all {
        text.replace(&request.old_text, &request.new_text)
    } else {
        text.replacen(&request.old_text, &request.new_text, 1)
    };
    let new_size = edited.len() as u64;
    if new_size > limit {
        return Err(Error::TooLarge {
            path: path.to_owned(),
            size: new_size,
            limit,
        });
    }
    // Rewrite in place (not via a temporary file and rename) so that the file keeps its inode,
    // mode and owner, and so that an in-workspace symlink keeps pointing at it.
    let write_error = |e| Error::io("cannot write", path, e);
    opened
        .file
        .write_all_at(edited.as_bytes(), 0)
        .map_err(write_error)?;
    opened.file.set_len(new_size).map_err(write_error)?;
    Ok(EditFileOutput {
        replacements: count,
    })
}

pub(crate) fn list_dir(
    workspace: &Workspace,
    limits: &Limits,
    request: &ListDirRequest,
) -> Result<ListDirOutput, Error> {
    let path = request.path.as_deref().unwrap_or("");
    let shown = if path.is_empty() { "." } else { path };
    let list_error = |e| Error::io("cannot list", shown, e);
    let mut dir = Dir::new(workspace.open_dir(shown)?).map_err(list_error)?;
    let mut names = Vec::new();
    for entry in dir.by_ref() {
        let entry = entry.map_err(list_error)?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push((entry.file_name().to_owned(), entry.file_type()));
        }
    }
    names.sort_by(|a, b| a.0.cmp(&b.0));
    let total = names.len() as u64;
    names.truncate(limits.max_list_entries);
    let dir_fd = dir.fd().map_err(list_error)?;
    let mut entries = Vec::with_capacity(names.len());
    for (name, file_type) in names {
        // Only regular files (for their size) and entries whose type the filesystem does not
        // report in the directory itself need a stat.
        let stat = match file_type {
            FileType::RegularFile | FileType::Unknown => {
                rustix::fs::statat(dir_fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW).ok()
            }
            FileType::Directory
            | FileType::Symlink
            | FileType::Fifo
            | FileType::Socket
            | FileType::CharacterDevice
            | FileType::BlockDevice => None,
        };
        let file_type = stat
            .as_ref()
            .map_or(file_type, |s| FileType::from_raw_mode(s.st_mode));
        let kind = entry_kind(file_type);
        let size = match kind {
            EntryKind::File => stat.map(|s| u64::try_from(s.st_size).unwrap_or(0)),
            EntryKind::Dir | EntryKind::Symlink | EntryKind::Special => None,
        };
        let name = String::from_utf8_lossy(name.to_bytes()).into_owned();
        entries.push(DirEntry { name, kind, size });
    }
    Ok(ListDirOutput { entries, total })
}

pub(crate) fn entry_kind(file_type: FileType) -> EntryKind {
    match file_type {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        FileType::Fifo
        | FileType::Socket
        | FileType::CharacterDevice
        | FileType::BlockDevice
        | FileType::Unknown => EntryKind::Special,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn workspace(files: &[(&str, &str)]) -> (tempfile::TempDir, Workspace) {
        let tmp = tempfile::tempdir().unwrap();
        for (path, content) in files {
            let full = tmp.path().join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, content).unwrap();
        }
        let workspace = Workspace::open(tmp.path()).unwrap();
        (tmp, workspace)
    }

    fn small_limits() -> Limits {
        Limits {
            max_read_bytes: 16,
            read_lines: 3,
            max_file_bytes: 64,
            ..Limits::default()
        }
    }

    /// Reads `(offset, limit)` of `content` with small limits and compares the whole output.
    fn check_read(
        content: &str,
        offset: Option<u64>,
        limit: Option<u64>,
        expected: ReadFileOutput,
    ) {
        let (_tmp, workspace) = workspace(&[("f.txt", content)]);
        let request = ReadFileRequest {
            path: "f.txt".into(),
            offset,
            limit,
        };
        let got = read_file(&workspace, &small_limits(), &request).unwrap();
        assert_eq!(got, expected, "{content:?} {offset:?} {limit:?}");
    }

    fn read(
        content: &str,
        lines: u64,
        size: u64,
        next_offset: Option<u64>,
        note: Option<&str>,
    ) -> ReadFileOutput {
        ReadFileOutput {
            content: content.into(),
            lines,
            size,
            next_offset,
            note: note.map(str::to_owned),
        }
    }

    #[test]
    fn reads_windows_of_lines() {
        check_read("a\nb\n", None, None, read("a\nb\n", 2, 4, None, None));
        check_read("a\nb", None, None, read("a\nb", 2, 3, None, None));
        check_read("", None, None, read("", 0, 0, None, None));
        check_read(
            "1\n2\n3\n4\n5\n",
            None,
            None,
            read("1\n2\n3\n", 3, 10, Some(3), None),
        );
        check_read("1\n2\n3\n", None, None, read("1\n2\n3\n", 3, 6, None, None));
        check_read(
            "1\n2\n3\n4\n5\n",
            Some(3),
            None,
            read("4\n5\n", 2, 10, None, None),
        );
        check_read(
            "1\n2\n3\n4\n5\n",
            Some(1),
            Some(2),
            read("2\n3\n", 2, 10, Some(3), None),
        );
        check_read(
            "1\n2\n",
            Some(5),
            None,
            read(
                "",
                0,
                4,
                None,
                Some("offset 5 is past the end of the file (2 lines)"),
            ),
        );
        check_read(
            "12345678\n12345678\n1\n",
            None,
            None,
            read(
                "12345678\n",
                1,
                20,
                Some(1),
                Some("stopped after 1 lines: the response limit is 16 bytes"),
            ),
        );
        check_read(
            "1234567\n1234567\n",
            None,
            None,
            read("1234567\n1234567\n", 2, 16, None, None),
        );
        check_read(
            "0123456789abcdefghij\nnext\n",
            None,
            None,
            read(
                "0123456789abcdef",
                1,
                26,
                Some(1),
                Some("line 1 is 21 bytes long; only its first 16 bytes are shown"),
            ),
        );
        check_read("é\n", None, None, read("é\n", 1, 3, None, None));
    }

    fn check_error(result: Result<impl std::fmt::Debug, Error>, expected: &str) {
        assert_eq!(result.unwrap_err().to_string(), expected);
    }

    #[test]
    fn refuses_binary_and_special_files() {
        let (_tmp, workspace) = workspace(&[("bin", "a\0b"), ("dir/x", "")]);
        let read = |path: &str| {
            read_file(
                &workspace,
                &small_limits(),
                &ReadFileRequest {
                    path: path.into(),
                    offset: None,
                    limit: None,
                },
            )
        };
        check_error(read("bin"), "binary file: bin");
        check_error(read("dir"), "not a regular file (directory): dir");
    }

    fn check_edit(
        content: &str,
        old: &str,
        new: &str,
        replace_all: bool,
        expected: Result<(&str, u64), &str>,
    ) {
        let (tmp, workspace) = workspace(&[("f.txt", content)]);
        let request = EditFileRequest {
            path: "f.txt".into(),
            old_text: old.into(),
            new_text: new.into(),
            replace_all,
        };
        let got = edit_file(&workspace, &small_limits(), &request);
        let after = std::fs::read_to_string(tmp.path().join("f.txt")).unwrap();
        match expected {
            Ok((text, count)) => {
                assert_eq!(
                    got.unwrap(),
                    EditFileOutput {
                        replacements: count
                    }
                );
                assert_eq!(after, text);
            }
            Err(message) => {
                assert_eq!(got.unwrap_err().to_string(), message);
                assert_eq!(after, content, "a failed edit leaves the file alone");
            }
        }
    }

    #[test]
    fn edits_unique_or_all_matches() {
        check_edit("fn a() {}\n", "a()", "b()", false, Ok(("fn b() {}\n", 1)));
        check_edit("x x x", "x", "yy", true, Ok(("yy yy yy", 3)));
        check_edit("long line here", "long line here", "s", false, Ok(("s", 1)));
        check_edit(
            "x x x",
            "x",
            "y",
            false,
            Err("old_text matches 3 times in f.txt; pass replace_all or give more context"),
        );
        check_edit("abc", "zzz", "y", false, Err("old_text not found in f.txt"));
        check_edit(
            "def f():\n    return 1\n",
            "return 2",
            "return 3",
            false,
            Err(
                "old_text not found in f.txt; the most similar text is line 2, as a JSON string: \"    return 1\"",
            ),
        );
        check_edit(
            "abc",
            "",
            "y",
            false,
            Err("invalid request: old_text is empty for f.txt"),
        );
        check_edit(
            "abc",
            "b",
            &"y".repeat(70),
            false,
            Err("too large (72 bytes, the limit is 64): f.txt"),
        );
    }

    #[test]
    fn writes_create_parents_and_replace_content() {
        let (tmp, workspace) = workspace(&[("old.txt", "a much longer previous content")]);
        let write = |path: &str, content: &str| {
            write_file(
                &workspace,
                &small_limits(),
                &WriteFileRequest {
                    path: path.into(),
                    content: content.into(),
                },
            )
        };
        assert_eq!(
            write("old.txt", "new").unwrap(),
            WriteFileOutput {
                bytes: 3,
                created: false
            }
        );
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("old.txt")).unwrap(),
            "new"
        );
        assert_eq!(
            write("/workspace/a/b/new.txt", "x\n").unwrap(),
            WriteFileOutput {
                bytes: 2,
                created: true
            }
        );
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("a/b/new.txt")).unwrap(),
            "x\n"
        );
        check_error(
            write("big", &"x".repeat(65)),
            "too large (65 bytes, the limit is 64): big",
        );
        assert!(!tmp.path().join("big").exists());
        check_error(write("old.txt/x", "x"), "not a directory: old.txt/x");
    }

    fn check_list(
        files: &[&str],
        limits: &Limits,
        path: Option<&str>,
        expected: &[(&str, EntryKind)],
        total: u64,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        for file in files {
            if let Some(dir) = file.strip_suffix('/') {
                std::fs::create_dir_all(tmp.path().join(dir)).unwrap();
            } else if let Some((link, target)) = file.split_once(" -> ") {
                std::os::unix::fs::symlink(target, tmp.path().join(link)).unwrap();
            } else {
                std::fs::write(tmp.path().join(file), "abc").unwrap();
            }
        }
        let workspace = Workspace::open(tmp.path()).unwrap();
        let got = list_dir(
            &workspace,
            limits,
            &ListDirRequest {
                path: path.map(str::to_owned),
            },
        )
        .unwrap();
        let expected: Vec<DirEntry> = expected
            .iter()
            .map(|&(name, kind)| DirEntry {
                name: name.into(),
                kind,
                size: (kind == EntryKind::File).then_some(3),
            })
            .collect();
        assert_eq!(
            got,
            ListDirOutput {
                entries: expected,
                total
            },
            "{files:?}"
        );
    }

    #[test]
    fn lists_sorted_with_kinds() {
        let limits = Limits::default();
        check_list(
            &["b.txt", "a/", "c -> /etc", "a/inner.txt"],
            &limits,
            None,
            &[
                ("a", EntryKind::Dir),
                ("b.txt", EntryKind::File),
                ("c", EntryKind::Symlink),
            ],
            3,
        );
        check_list(
            &["a/", "a/x", "a/y/"],
            &limits,
            Some("a"),
            &[("x", EntryKind::File), ("y", EntryKind::Dir)],
            2,
        );
        let two = Limits {
            max_list_entries: 2,
            ..Limits::default()
        };
        check_list(
            &["d", "c", "b", "a"],
            &two,
            None,
            &[("a", EntryKind::File), ("b", EntryKind::File)],
            4,
        );
        check_list(&[], &limits, Some("/workspace"), &[], 0);
    }

    #[test]
    fn listing_refuses_files_and_escapes() {
        let (tmp, workspace) = workspace(&[("f", "")]);
        std::os::unix::fs::symlink("/etc", tmp.path().join("etc")).unwrap();
        let list = |path: &str| {
            list_dir(
                &workspace,
                &Limits::default(),
                &ListDirRequest {
                    path: Some(path.into()),
                },
            )
        };
        check_error(list("f"), "not a directory: f");
        check_error(list("etc"), &workspace.symlink_escape_message("etc"));
        check_error(list(".."), "path escapes the workspace: ..");
        check_error(list("nope"), "no such file or directory: nope");
        assert!(Path::new("/etc").is_dir());
    }
}
