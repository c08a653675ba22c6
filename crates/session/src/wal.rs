//! Room ahead in the write-ahead log's file, so a commit overwrites blocks the file already
//! has instead of growing it.
//!
//! Why: every commit ends in an `fsync` of the WAL. When the commit's frames extend the file,
//! that `fsync` must also make the new size and the new blocks durable, which on ext4 is a
//! journal commit on top of the data flush; frames written over blocks the file already
//! holds need the data flush alone. SQLite appends frames at the end of the WAL until a
//! checkpoint lets it start over from the beginning, and it deletes the file when the last
//! connection closes, so a process's first few thousand commits (and every commit of the
//! benchmarks) grew the file, one or two pages at a time.
//!
//! So the writer keeps some zeroed, synced space past the end of SQLite's frames. SQLite
//! reads a WAL only up to its last valid frame (a zero frame has the wrong salt), exactly as
//! it ignores the stale frames it leaves behind itself when it starts the log over, so the
//! zeros are never taken for data. They are only ever written past the file's end, and only
//! while this connection holds the database's write lock: nobody else writes frames at the
//! same time, and every frame that exists lies before the end of the file.
//!
//! The file's size is read from a descriptor kept open, with a seek to its end, never with
//! `stat`. On Linux 6.13 and later, ext4, xfs, btrfs and tmpfs keep multigrain timestamps:
//! once anyone has asked for a file's times, its next write stamps it with a fine-grained
//! time, so the inode changes on every write instead of once per clock tick. SQLite syncs
//! with `fsync`, which writes a changed inode with the data: one more synchronous I/O in
//! every commit. A `stat` of the WAL before each commit cost that much (on this project's
//! machine a durable append went from 1.8x to 1.4x a raw `fdatasync` without it).
//! The descriptor could outlive the file only if SQLite deleted the WAL, which it does
//! when the last connection closes; the writing connection is open as long as this is, and
//! zeroes written to a deleted file would harm nothing anyway.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek as _, SeekFrom};
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;

/// The most zeroes written past the end of the WAL's frames at a time: some 400 commits of
/// a single append (two or three 4 KiB pages each) before the next extension.
const ROOM: u64 = 4 << 20;
/// The least: a short-lived process (one `nerve approve`) should not write megabytes of
/// zeroes it never uses, so the room doubles with the WAL from here up to [`ROOM`].
const MIN_ROOM: u64 = 256 << 10;
/// The zero buffer written repeatedly to make the room.
const BLOCK: usize = 64 << 10;

/// The WAL of a database, opened on first use and kept open.
#[derive(Debug)]
struct WalFile {
    path: PathBuf,
    file: Option<File>,
}

impl WalFile {
    /// The WAL of the database at `database` (SQLite names it after the database file).
    fn new(database: &str) -> Self {
        Self {
            path: PathBuf::from(format!("{database}-wal")),
            file: None,
        }
    }

    /// The open file; `None` while it does not exist (SQLite creates it when a connection
    /// first reads in WAL mode).
    fn get(&mut self) -> io::Result<Option<&mut File>> {
        if self.file.is_none() {
            match OpenOptions::new().write(true).open(&self.path) {
                Ok(file) => self.file = Some(file),
                Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(error) => return Err(error),
            }
        }
        Ok(self.file.as_mut())
    }
}

/// The WAL file of one writing connection, and how far it was extended.
#[derive(Debug)]
pub(crate) struct WalRoom {
    wal: WalFile,
    /// The file's size after the last extension: as long as it stays there, SQLite's
    /// frames are being written into the zeros.
    extended_to: u64,
}

impl WalRoom {
    /// The WAL of the database at `database`.
    pub(crate) fn new(database: &str) -> Self {
        Self {
            wal: WalFile::new(database),
            extended_to: 0,
        }
    }

    /// Makes room when SQLite's frames have reached the end of the file (or the file was
    /// created or truncated since the last look). Call only while holding the write lock
    /// (inside an immediate transaction). An error costs only speed: the commit goes on.
    pub(crate) fn ensure(&mut self) -> io::Result<()> {
        // Until SQLite creates the WAL there is nothing to extend.
        let Some(file) = self.wal.get()? else {
            return Ok(());
        };
        let size = file.seek(SeekFrom::End(0))?;
        if size == self.extended_to {
            return Ok(());
        }
        let zeros = vec![0u8; BLOCK];
        let end = size + size.clamp(MIN_ROOM, ROOM);
        let mut at = size;
        while at < end {
            file.write_all_at(&zeros, at)?;
            at += BLOCK as u64;
        }
        // Now rather than in the next commit's fsync: the new blocks and the new size.
        file.sync_data()?;
        self.extended_to = at;
        Ok(())
    }
}

/// Makes the WAL's written frames durable with `fdatasync`, for a writer whose connection
/// commits with `synchronous=NORMAL` (frames written, not flushed) and which tells nobody
/// that a write committed before a flush that began after it has returned. Each thread that
/// flushes holds its own (see [`WalFlush::another`]); any descriptor of the file flushes
/// every frame written to it.
#[derive(Debug)]
pub(crate) struct WalFlush {
    wal: WalFile,
}

impl WalFlush {
    /// The WAL of the database at `database`.
    pub(crate) fn new(database: &str) -> Self {
        Self {
            wal: WalFile::new(database),
        }
    }

    /// Another handle on the same file, for another thread.
    pub(crate) fn another(&self) -> Self {
        Self {
            wal: WalFile {
                path: self.wal.path.clone(),
                file: None,
            },
        }
    }

    /// Flushes every frame written so far. After a commit the WAL exists, so a missing file
    /// is an error here: the frames it held are not known to be durable.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        match self.wal.get()? {
            Some(file) => file.sync_data(),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is missing", self.wal.path.display()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(path: &std::path::Path) -> u64 {
        std::fs::metadata(path).unwrap().len()
    }

    /// The size after room is made at `end`: as much again, within the bounds, in whole
    /// zero blocks.
    fn with_room(end: u64) -> u64 {
        end + end.clamp(MIN_ROOM, ROOM).next_multiple_of(BLOCK as u64)
    }

    #[test]
    fn room_follows_the_file_through_growth_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("log.db");
        let wal = dir.path().join("log.db-wal");
        let mut room = WalRoom::new(database.to_str().unwrap());
        // No WAL yet: nothing to do, and no file made.
        room.ensure().unwrap();
        assert!(!wal.exists());

        std::fs::write(&wal, [1u8; 100]).unwrap();
        room.ensure().unwrap();
        let extended = size(&wal);
        assert_eq!(extended, with_room(100));
        // Frames written into the room leave the size alone: no new room.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&wal)
            .unwrap()
            .write_all_at(&[2u8; 4096], 100)
            .unwrap();
        room.ensure().unwrap();
        assert_eq!(size(&wal), extended);

        // The frames reached the end (the file grew past the room): room again, doubled.
        let file = std::fs::OpenOptions::new().write(true).open(&wal).unwrap();
        file.write_all_at(&[3u8; 10], extended).unwrap();
        room.ensure().unwrap();
        assert_eq!(size(&wal), with_room(extended + 10));
        assert!(size(&wal) >= 2 * (extended + 10));

        // Truncated (a TRUNCATE checkpoint, or a size limit): the same file, seen anew.
        file.set_len(0).unwrap();
        room.ensure().unwrap();
        assert_eq!(size(&wal), with_room(0));
        assert!(std::fs::read(&wal).unwrap().iter().all(|&b| b == 0));
    }
}
