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

use std::fs::OpenOptions;
use std::io;
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

/// The WAL file of one writing connection, and how far it was extended.
#[derive(Debug)]
pub(crate) struct WalRoom {
    path: PathBuf,
    /// The file's size after the last extension: as long as it stays there, SQLite's
    /// frames are being written into the zeros.
    extended_to: u64,
}

impl WalRoom {
    /// The WAL of the database at `database` (SQLite names it after the database file).
    pub(crate) fn new(database: &str) -> Self {
        Self {
            path: PathBuf::from(format!("{database}-wal")),
            extended_to: 0,
        }
    }

    /// Makes room when SQLite's frames have reached the end of the file (or the file was
    /// created or truncated since the last look). Call only while holding the write lock
    /// (inside an immediate transaction). An error costs only speed: the commit goes on.
    pub(crate) fn ensure(&mut self) -> io::Result<()> {
        // By name, each time: a file handle kept open could outlive the file if SQLite
        // deleted it (it does when the last connection closes) and made a new one.
        let size = match std::fs::metadata(&self.path) {
            Ok(meta) => meta.len(),
            // SQLite creates the WAL when a connection first reads in WAL mode; until
            // then there is nothing to extend.
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        if size == self.extended_to {
            return Ok(());
        }
        let file = OpenOptions::new().write(true).open(&self.path)?;
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
