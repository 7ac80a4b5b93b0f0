//! What filters did to a packed batch without decoding it: which rows remain and
//! which top-level fields were set, removed or renamed, applied while reading.
//!
//! A `Selection` is the sorted row numbers kept among a piece's rows (native-endian
//! u32, as pyarrow's uint32 buffer holds them). An `Edit` is one filter's change to
//! every record, with the semantics of `logrouter.filters.fields` on a Python dict
//! (insertion order included): `Set` overwrites a field in place or appends it,
//! `Remove` drops fields, `Rename` drops every old name and then sets each new name
//! that had an old value, all at once. A record becomes a list of `Span`s (key and
//! where its msgpack value lies: in the blob, or in a set value's own bytes), edited
//! in order, and the columns are built from that list as if the record had it.
//!
//! `texts` reads one field of every selected (edited) record as the text
//! `logrouter.filters.grep.as_text` gives it, for a predicate evaluated by pyarrow.

use crate::reader::{hour_bucket, Head, Outside, Reader, R};

/// One filter's change to every record; keys and set values (msgpack) are owned.
pub enum Edit {
    Set(Vec<(Vec<u8>, Vec<u8>)>),
    Remove(Vec<Vec<u8>>),
    Rename(Vec<(Vec<u8>, Vec<u8>)>),
}

/// A field of one record: key, the bytes its value is in, value start and end.
pub type Span<'a> = (&'a [u8], &'a [u8], usize, usize);

/// Read a record's `count` fields (its map head read) as spans of `blob`.
pub fn spans<'a>(r: &mut Reader<'a>, count: usize, out: &mut Vec<Span<'a>>) -> R<()> {
    out.clear();
    for _ in 0..count {
        let key = r.key()?;
        if out.iter().any(|s| s.0 == key) {
            return Err(Outside); // a key twice: Python's dict decides
        }
        let start = r.pos;
        r.check_value(1)?;
        out.push((key, r.buf, start, r.pos));
    }
    Ok(())
}

fn set<'a>(row: &mut Vec<Span<'a>>, span: Span<'a>) {
    match row.iter_mut().find(|s| s.0 == span.0) {
        Some(found) => *found = span,
        None => row.push(span),
    }
}

/// Apply `edits` in order to one record's fields.
pub fn apply<'a>(row: &mut Vec<Span<'a>>, edits: &'a [Edit], moved: &mut Vec<Span<'a>>) {
    for edit in edits {
        match edit {
            Edit::Set(pairs) => {
                for (key, value) in pairs {
                    set(row, (key, value, 0, value.len()));
                }
            }
            Edit::Remove(keys) => row.retain(|s| !keys.iter().any(|k| k.as_slice() == s.0)),
            Edit::Rename(pairs) => {
                moved.clear();
                for (old, new) in pairs {
                    if let Some(s) = row.iter().find(|s| s.0 == old.as_slice()) {
                        moved.push((new.as_slice(), s.1, s.2, s.3));
                    }
                }
                if moved.is_empty() {
                    continue;
                }
                row.retain(|s| !pairs.iter().any(|(old, _)| old.as_slice() == s.0));
                for &span in moved.iter() {
                    set(row, span);
                }
            }
        }
    }
}

/// Whether the row numbered `ordinal` (0-based among the piece's rows) is selected;
/// `next` walks the sorted selection alongside.
#[inline]
pub fn selected(selection: Option<&[u8]>, next: &mut usize, ordinal: usize) -> bool {
    let Some(rows) = selection else { return true };
    let at = *next * 4;
    match rows.get(at..at + 4) {
        Some(b) if u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize == ordinal => {
            *next += 1;
            true
        }
        _ => false,
    }
}

/// Whether an entry stamped `time` is one of a piece's rows: in its hour `bucket` (None:
/// any hour), past the first `start` of those, and `selected`. Counts the entries of
/// the bucket in `taken`; `next` walks the selection.
#[inline]
pub fn takes(bucket: Option<i64>, start: usize, selection: Option<&[u8]>, time: i64, taken: &mut usize, next: &mut usize) -> bool {
    match bucket {
        Some(bucket) if hour_bucket(time) != bucket => false,
        _ => {
            *taken += 1;
            *taken > start && selected(selection, next, *taken - 1 - start)
        }
    }
}

/// The text grep sees of a value, appended to `out`; false for a value whose text
/// only Python gives (floats, tables, arrays, bin that is not UTF-8) — then the
/// caller's Python path decides. Nil is handled by the caller.
fn text(head: &Head, out: &mut Vec<u8>) -> bool {
    match head {
        Head::Str(s) => out.extend_from_slice(s),
        Head::Bin(b) => {
            if std::str::from_utf8(b).is_err() {
                return false;
            }
            out.extend_from_slice(b)
        }
        Head::Bool(true) => out.extend_from_slice(b"true"),
        Head::Bool(false) => out.extend_from_slice(b"false"),
        Head::Int(v) => out.extend_from_slice(v.to_string().as_bytes()),
        Head::Big(v) => out.extend_from_slice(v.to_string().as_bytes()),
        _ => return false,
    }
    true
}

/// Follow `path` (map keys below the top-level one) from a value; None: absent.
fn descend<'a>(mut v: Reader<'a>, path: &[&[u8]]) -> R<Option<Head<'a>>> {
    let mut head = v.head()?;
    for &want in path {
        let Head::Map(n) = head else { return Ok(None) };
        let mut found = None;
        for _ in 0..n {
            let key = v.key()?;
            if key == want && found.is_none() {
                found = Some(v.head()?);
                break;
            }
            v.check_value(1)?;
        }
        match found {
            Some(h) => head = h,
            None => return Ok(None),
        }
    }
    Ok(Some(head))
}

/// One piece for `texts`: blob, clock for time-0 entries, hour bucket, row range,
/// selection and edits (as `columns::Piece` plus what filters did).
pub struct Rows<'a> {
    pub blob: &'a [u8],
    pub now: Option<i64>,
    pub bucket: Option<i64>,
    pub start: usize,
    pub stop: usize,
    pub selection: Option<&'a [u8]>,
    pub edits: &'a [Edit],
}

/// Call `visit` with the fields of each selected row of `pieces`, after their edits.
fn each_row<'a>(pieces: &[Rows<'a>], mut visit: impl FnMut(&[Span<'a>]) -> R<()>) -> R<()> {
    let mut row: Vec<Span> = Vec::new();
    let mut moved: Vec<Span> = Vec::new();
    for piece in pieces {
        let mut r = Reader::new(piece.blob);
        let (mut taken, mut next) = (0usize, 0usize);
        while !r.at_end() && taken < piece.stop {
            let (mut time, count) = r.entry_head()?;
            if time == 0 {
                time = piece.now.ok_or(Outside)?;
            }
            let take = takes(piece.bucket, piece.start, piece.selection, time, &mut taken, &mut next);
            if !take {
                r.check_map(count, 1)?;
                continue;
            }
            spans(&mut r, count, &mut row)?;
            apply(&mut row, piece.edits, &mut moved);
            visit(&row)?;
        }
    }
    Ok(())
}

/// The value at `path` (a top-level key, then map keys) of one row's fields.
fn lookup<'a>(row: &[Span<'a>], path: &[&[u8]]) -> R<Option<Head<'a>>> {
    let (first, rest) = path.split_first().ok_or(Outside)?;
    match row.iter().find(|s| s.0 == *first) {
        Some(&(_, buf, start, end)) => descend(Reader { buf: &buf[..end], pos: start }, rest),
        None => Ok(None),
    }
}

/// A string column being built: validity, bytes, offsets, nulls.
#[derive(Default)]
pub struct Strings {
    pub rows: usize,
    pub nulls: usize,
    pub validity: Vec<u8>,
    pub data: Vec<u8>,
    pub offsets: Vec<i32>,
}

impl Strings {
    fn push(&mut self, valid: bool) -> R<()> {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        if self.rows % 8 == 0 {
            self.validity.push(0);
        }
        if valid {
            self.validity[self.rows / 8] |= 1 << (self.rows % 8);
        } else {
            self.nulls += 1;
        }
        self.offsets.push(i32::try_from(self.data.len()).map_err(|_| Outside)?);
        self.rows += 1;
        Ok(())
    }
}

/// The text of the field at `path` of each selected row of `pieces`, after their
/// edits, as grep sees it: null where missing or nil. `Outside` where a value's text
/// is Python's to give, or a blob is outside the subset.
pub fn texts(pieces: &[Rows], path: &[&[u8]]) -> R<Strings> {
    let mut out = Strings::default();
    each_row(pieces, |row| {
        match lookup(row, path)? {
            None | Some(Head::Nil) => out.push(false),
            Some(head) => {
                if !text(&head, &mut out.data) {
                    return Err(Outside);
                }
                out.push(true)
            }
        }
    })?;
    Ok(out)
}

pub const MISSING: u8 = 0;
pub const NIL: u8 = 1;
pub const BOOL: u8 = 2;
pub const INT: u8 = 3;
pub const FLOAT: u8 = 4;
pub const STR: u8 = 5;
pub const BIN: u8 = 6;
pub const CONTAINER: u8 = 7;
/// An integer whose float64 is not exact (beyond 2^53): compared only in Python.
pub const WIDE_INT: u8 = 8;
/// A bin that is not UTF-8: its text (lossy) only Python gives.
pub const RAW_BIN: u8 = 9;

/// What a condition reads of one field, per row: kinds, texts, numbers.
pub type Values = (Vec<u8>, Strings, Vec<f64>);

/// What conditions read of the fields at `paths` of each selected row, in one walk:
/// per path, each row's kind (one of the codes above), its text where it has one (str,
/// UTF-8 bin, int, bool), and its number (int or float, as float64; 0 otherwise).
pub fn values(pieces: &[Rows], paths: &[Vec<&[u8]>]) -> R<Vec<Values>> {
    let mut out: Vec<Values> = paths.iter().map(|_| (Vec::new(), Strings::default(), Vec::new())).collect();
    each_row(pieces, |row| {
        for (path, (kinds, texts, numbers)) in paths.iter().zip(out.iter_mut()) {
            value(row, path, kinds, texts, numbers)?;
        }
        Ok(())
    })?;
    Ok(out)
}

fn value(row: &[Span], path: &[&[u8]], kinds: &mut Vec<u8>, texts: &mut Strings, numbers: &mut Vec<f64>) -> R<()> {
    const EXACT: i64 = 1 << 53;
    {
        let head = lookup(row, path)?;
        let (kind, number) = match head {
            None => (MISSING, 0.0),
            Some(Head::Nil) => (NIL, 0.0),
            Some(Head::Bool(_)) => (BOOL, 0.0),
            Some(Head::Int(v)) if (-EXACT..=EXACT).contains(&v) => (INT, v as f64),
            Some(Head::Int(_)) | Some(Head::Big(_)) => (WIDE_INT, 0.0),
            Some(Head::Float(v)) => (FLOAT, v),
            Some(Head::Str(_)) => (STR, 0.0),
            Some(Head::Bin(b)) => (if std::str::from_utf8(b).is_ok() { BIN } else { RAW_BIN }, 0.0),
            Some(Head::Array(_)) | Some(Head::Map(_)) => (CONTAINER, 0.0),
        };
        kinds.push(kind);
        numbers.push(number);
        let has_text = matches!(kind, BOOL | INT | STR | BIN | WIDE_INT);
        if has_text {
            text(&head.ok_or(Outside)?, &mut texts.data);
        }
        texts.push(has_text)
    }
}

/// Where the entries of the rows numbered `wanted` (ascending, among the piece's
/// selected rows) lie in its blob: `(start, end)` each, to decode just those.
pub fn entries_at(piece: &Rows, wanted: &[usize]) -> R<Vec<(usize, usize)>> {
    let mut found = Vec::new();
    let mut r = Reader::new(piece.blob);
    let (mut taken, mut next, mut ordinal) = (0usize, 0usize, 0usize);
    while !r.at_end() && taken < piece.stop && found.len() < wanted.len() {
        let start = r.pos;
        let (mut time, count) = r.entry_head()?;
        if time == 0 {
            time = piece.now.ok_or(Outside)?;
        }
        let take = takes(piece.bucket, piece.start, piece.selection, time, &mut taken, &mut next);
        r.check_map(count, 1)?;
        if take {
            if wanted[found.len()] == ordinal {
                found.push((start, r.pos));
            }
            ordinal += 1;
        }
    }
    if found.len() < wanted.len() {
        return Err(Outside);
    }
    Ok(found)
}
