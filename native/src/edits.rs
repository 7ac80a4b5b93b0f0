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

/// The text of the field at `path` (top-level key, then map keys) of each selected
/// row of `pieces`, after their edits: a string column's validity (null: missing or
/// nil), bytes and offsets, with the null count. `Outside` where a value's text is
/// Python's to give, or a blob is outside the subset.
pub fn texts(pieces: &[Rows], path: &[&[u8]]) -> R<(usize, usize, Vec<u8>, Vec<u8>, Vec<i32>)> {
    let (first, rest) = path.split_first().ok_or(Outside)?;
    let (mut rows, mut nulls) = (0usize, 0usize);
    let (mut validity, mut data, mut offsets) = (Vec::new(), Vec::new(), vec![0i32]);
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
            let take = match piece.bucket {
                Some(bucket) if hour_bucket(time) != bucket => false,
                _ => {
                    taken += 1;
                    taken > piece.start && selected(piece.selection, &mut next, taken - 1 - piece.start)
                }
            };
            if !take {
                r.check_map(count, 1)?;
                continue;
            }
            spans(&mut r, count, &mut row)?;
            apply(&mut row, piece.edits, &mut moved);
            let value = match row.iter().find(|s| s.0 == *first) {
                Some(&(_, buf, start, end)) => descend(Reader { buf: &buf[..end], pos: start }, rest)?,
                None => None,
            };
            if rows % 8 == 0 {
                validity.push(0);
            }
            match value {
                None | Some(Head::Nil) => nulls += 1,
                Some(head) => {
                    if !text(&head, &mut data) {
                        return Err(Outside);
                    }
                    validity[rows / 8] |= 1 << (rows % 8);
                }
            }
            offsets.push(i32::try_from(data.len()).map_err(|_| Outside)?);
            rows += 1;
        }
    }
    Ok((rows, nulls, validity, data, offsets))
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
        let take = match piece.bucket {
            Some(bucket) if hour_bucket(time) != bucket => false,
            _ => {
                taken += 1;
                taken > piece.start && selected(piece.selection, &mut next, taken - 1 - piece.start)
            }
        };
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
