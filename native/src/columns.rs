//! PackedForward entries straight into the Arrow buffers of one lake row group.
//!
//! `run` walks the entries of one or more blobs once. For each record it appends the
//! event time, each field of the file's schema to its typed column when the value
//! fits (the rules of `logrouter.lake.convert`: an int in a float64 column becomes a
//! float, a str in a binary column its bytes, nil is null, anything else does not
//! fit), and writes everything else as the row's `_extra` JSON object: first the
//! fields outside the schema in the record's order (nil ones left out), then the
//! values that did not fit, in the schema's column order. It also notes, per field,
//! the order of first appearance and the first scalar type seen, which is all the
//! lake's schema rules (`logrouter.lake.schema`) need to pick a new file's columns and
//! to learn types for the next file.

use crate::edits::{self, Edit, Span};
use crate::json;
use crate::reader::{utf8, Head, Outside, Reader, R};
use std::collections::HashMap;

pub const BOOL: u8 = 1;
pub const INT64: u8 = 2;
pub const FLOAT64: u8 = 3;
pub const STRING: u8 = 4;
pub const BINARY: u8 = 5;

/// One blob's rows to take: of its entries (or of those of one hour bucket only),
/// the ones numbered `start` up to `stop`; of those, the `selection` (sorted u32
/// row numbers from 0 at `start`; None: all), each with the filters' `edits` applied.
/// `checked`: `reader::scan` took this blob already, so its strings, keys and nesting
/// are not checked again.
pub struct Piece<'a> {
    pub blob: &'a [u8],
    pub now: Option<i64>,
    pub bucket: Option<i64>,
    pub start: usize,
    pub stop: usize,
    pub selection: Option<&'a [u8]>,
    pub edits: &'a [Edit],
    pub checked: bool,
    /// The JSON text of the blob's top-level containers, where the blob is the
    /// transcode of JSON documents (`jsondoc::scan`): `_extra` takes their text as it
    /// came instead of writing it again from the msgpack.
    pub texts: Option<Texts<'a>>,
}

/// `jsondoc::Scanned`'s `index` (native-endian u32 triples: the value's offset in the
/// blob, its text's start and end in `data`, ascending by offset) and `texts`.
#[derive(Clone, Copy)]
pub struct Texts<'a> {
    pub index: &'a [u8],
    pub data: &'a [u8],
}

impl<'a> Texts<'a> {
    fn word(&self, i: usize) -> usize {
        let b = &self.index[i * 4..i * 4 + 4];
        u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize
    }

    /// The JSON text of the value whose msgpack starts at `at` in the blob, if indexed.
    /// `next`: where to look first (the entry after the last one found, which is the
    /// one wanted when the containers are asked for in blob order, as `run` does);
    /// elsewhere a binary search.
    fn of(&self, at: usize, next: &mut usize) -> Option<&'a [u8]> {
        let entries = self.index.len() / 12;
        let found = if *next < entries && self.word(*next * 3) == at {
            Some(*next)
        } else {
            let (mut low, mut high) = (0, entries);
            let mut found = None;
            while low < high {
                let mid = (low + high) / 2;
                let here = self.word(mid * 3);
                if here == at {
                    found = Some(mid);
                    break;
                }
                if here < at {
                    low = mid + 1;
                } else {
                    high = mid;
                }
            }
            found
        }?;
        *next = found + 1;
        self.data.get(self.word(found * 3 + 1)..self.word(found * 3 + 2))
    }
}

/// A field met in the row group (or named by the schema).
pub struct Field<'a> {
    pub name: &'a [u8],
    pub column: Option<usize>,
    /// The type code of its first scalar value (0: none yet).
    pub first: u8,
    /// A float came after a first scalar that was an int.
    pub float_after_int: bool,
    stamp: usize,
    seen: bool,
}

impl Field<'_> {
    #[inline]
    fn observe(&mut self, head: &Head) {
        let kind = match head {
            Head::Bool(_) => BOOL,
            Head::Int(_) => INT64,
            Head::Float(_) => FLOAT64,
            Head::Str(_) => STRING,
            Head::Bin(_) => BINARY,
            _ => return, // nil, containers and ints beyond int64 are no scalar type
        };
        if self.first == 0 {
            self.first = kind;
        } else if self.first == INT64 && kind == FLOAT64 {
            self.float_after_int = true;
        }
    }
}

/// An Arrow array being built: validity bitmap, then values (a bitmap for bool,
/// 8 bytes each for int64 and float64, int32 offsets and bytes for string and binary).
pub struct Column {
    pub kind: u8,
    pub len: usize,
    pub nulls: usize,
    pub validity: Vec<u8>,
    pub data: Vec<u8>,
    pub offsets: Vec<i32>,
}

impl Column {
    pub fn new(kind: u8) -> Self {
        let offsets = if kind == STRING || kind == BINARY { vec![0] } else { Vec::new() };
        Column { kind, len: 0, nulls: 0, validity: Vec::new(), data: Vec::new(), offsets }
    }

    #[inline]
    fn bit(bits: &mut Vec<u8>, index: usize, set: bool) {
        if index % 8 == 0 {
            bits.push(0);
        }
        if set {
            let last = bits.len() - 1;
            bits[last] |= 1 << (index % 8);
        }
    }

    #[inline]
    fn valid(&mut self) {
        Self::bit(&mut self.validity, self.len, true);
        self.len += 1;
    }

    #[inline]
    pub fn push_null(&mut self) {
        Self::bit(&mut self.validity, self.len, false);
        match self.kind {
            BOOL => Self::bit(&mut self.data, self.len, false),
            INT64 | FLOAT64 => self.data.extend_from_slice(&[0; 8]),
            _ => self.offsets.push(self.data.len() as i32),
        }
        self.len += 1;
        self.nulls += 1;
    }

    #[inline]
    fn push_bool(&mut self, value: bool) {
        Self::bit(&mut self.data, self.len, value);
        self.valid();
    }

    #[inline]
    fn push_fixed(&mut self, bytes: [u8; 8]) {
        self.data.extend_from_slice(&bytes);
        self.valid();
    }

    #[inline]
    pub fn push_bytes(&mut self, bytes: &[u8]) -> R<()> {
        self.data.extend_from_slice(bytes);
        self.finish_bytes()
    }

    /// Close a value whose bytes were appended to `data` already.
    #[inline]
    fn finish_bytes(&mut self) -> R<()> {
        let end = i32::try_from(self.data.len()).map_err(|_| Outside)?; // beyond 2 GiB: Python's path
        self.offsets.push(end);
        self.valid();
        Ok(())
    }

    /// Append `head` if it fits this column's type; false if it does not.
    #[inline]
    fn fit(&mut self, head: &Head) -> R<bool> {
        match (self.kind, head) {
            (_, Head::Nil) => self.push_null(),
            (BOOL, Head::Bool(v)) => self.push_bool(*v),
            (INT64, Head::Int(v)) => self.push_fixed(v.to_ne_bytes()),
            (FLOAT64, Head::Float(v)) => self.push_fixed(v.to_ne_bytes()),
            (FLOAT64, Head::Int(v)) => self.push_fixed((*v as f64).to_ne_bytes()),
            (STRING, Head::Str(s)) | (BINARY, Head::Str(s)) | (BINARY, Head::Bin(s)) => self.push_bytes(s)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}


/// What `run` built: the rows' times, the schema's columns, `_extra`, and the fields
/// in order of first appearance.
pub struct Output<'a> {
    pub rows: usize,
    pub times: Vec<i64>,
    pub columns: Vec<Column>,
    pub extra: Column,
    pub fields: Vec<Field<'a>>,
    pub order: Vec<usize>,
}

/// Walk `pieces`. With `build`, fill a column per `schema` entry (name, type code)
/// and `_extra`; without, only note the fields (a new file's first row group).
pub fn run<'a>(pieces: &[Piece<'a>], schema: &[(&'a [u8], u8)], build: bool) -> R<Output<'a>> {
    let mut walk = Walk { fields: Vec::new(), index: HashMap::new(), shape: Vec::new(), unknown: Vec::new(), misfits: Vec::new() };
    for (column, &(name, kind)) in schema.iter().enumerate() {
        if !matches!(kind, BOOL | INT64 | FLOAT64 | STRING | BINARY) || walk.index.insert(name, column).is_some() {
            return Err(Outside);
        }
        walk.fields.push(Field { name, column: Some(column), first: 0, float_after_int: false, stamp: 0, seen: false });
    }
    let mut out = Output {
        rows: 0,
        times: Vec::new(),
        columns: if build { schema.iter().map(|&(_, kind)| Column::new(kind)).collect() } else { Vec::new() },
        extra: Column::new(STRING),
        fields: Vec::new(),
        order: Vec::new(),
    };
    let mut edited: Vec<Span<'a>> = Vec::new();
    let mut moved: Vec<Span<'a>> = Vec::new();
    for piece in pieces {
        let mut r = Reader::new(piece.blob);
        let mut taken = 0; // entries of the piece's bucket met so far
        let mut next = 0; // place in the piece's selection
        let mut next_text = 0; // place in the piece's texts index
        while !r.at_end() && taken < piece.stop {
            let (mut time, count) = r.entry_head()?;
            if time == 0 {
                time = piece.now.ok_or(Outside)?;
            }
            let skip = !edits::takes(piece.bucket, piece.start, piece.selection, time, &mut taken, &mut next);
            if skip {
                if piece.checked {
                    for _ in 0..count {
                        r.skip_value()?;
                        r.skip_value()?;
                    }
                } else {
                    r.check_map(count, 1)?;
                }
                continue;
            }
            let row = out.rows + 1; // stamps start at 1: 0 is "never"
            walk.unknown.clear();
            walk.misfits.clear();
            if piece.edits.is_empty() {
                for position in 0..count {
                    let key = if piece.checked {
                        match r.head()? {
                            Head::Str(s) => s,
                            _ => return Err(Outside),
                        }
                    } else {
                        r.key()?
                    };
                    walk.field(&mut out, build, row, position, key, &mut r, piece.checked)?;
                }
            } else {
                edits::spans(&mut r, count, &mut edited)?;
                edits::apply(&mut edited, piece.edits, &mut moved);
                for (position, &(key, buf, start, end)) in edited.iter().enumerate() {
                    walk.field(&mut out, build, row, position, key, &mut Reader { buf: &buf[..end], pos: start }, false)?;
                }
            }
            out.rows = row;
            out.times.push(time);
            if build {
                for column in out.columns.iter_mut() {
                    if column.len < row {
                        column.push_null();
                    }
                }
                let (unknown, misfits) = (&walk.unknown, &mut walk.misfits);
                if unknown.is_empty() && misfits.is_empty() {
                    out.extra.push_null();
                } else {
                    misfits.sort_by_key(|&(column, _)| column);
                    let text = &mut out.extra.data;
                    text.push(b'{');
                    let spans = unknown.iter().chain(misfits.iter().map(|(_, span)| span));
                    for (i, &(key, buf, start, end)) in spans.enumerate() {
                        if i > 0 {
                            text.push(b',');
                        }
                        json::string(text, key);
                        text.push(b':');
                        // The piece's own blob (an edited row's spans hold a prefix of
                        // it); an edit's values are bytes of their own.
                        // Only top-level containers are indexed (`jsondoc::Spliced`).
                        let same = buf.as_ptr() == piece.blob.as_ptr() && buf.len() <= piece.blob.len();
                        let container = matches!(buf[start], 0x80..=0x9f | 0xdc..=0xdf);
                        match piece.texts.filter(|_| same && container).and_then(|t| t.of(start, &mut next_text)) {
                            Some(json) => text.extend_from_slice(json),
                            None => {
                                let mut value = Reader { buf: &buf[..end], pos: start };
                                json::value(&mut value, text, 1)?;
                            }
                        }
                    }
                    text.push(b'}');
                    out.extra.finish_bytes()?;
                }
            }
        }
    }
    out.fields = walk.fields;
    Ok(out)
}

/// The fields met so far and the current row's values that go to `_extra`.
struct Walk<'a> {
    fields: Vec<Field<'a>>,
    index: HashMap<&'a [u8], usize>,
    // The previous record's keys and field ids: records of one sender mostly repeat
    // their shape, and a key equal to the one at its place there needs no lookup.
    shape: Vec<(&'a [u8], usize)>,
    unknown: Vec<Span<'a>>,
    misfits: Vec<(usize, Span<'a>)>,
}

impl<'a> Walk<'a> {
    /// Take the value `v` is at, of field `key` (the `position`-th of row `row`).
    #[inline]
    /// `checked`: the value was checked by `reader::scan` already (see `Piece`).
    #[allow(clippy::too_many_arguments)]
    fn field(&mut self, out: &mut Output<'a>, build: bool, row: usize, position: usize, key: &'a [u8], v: &mut Reader<'a>, checked: bool) -> R<()> {
        let id = match self.shape.get(position) {
            Some(&(known, id)) if known == key => id,
            _ => {
                let fields = &mut self.fields;
                let id = *self.index.entry(key).or_insert_with(|| {
                    fields.push(Field { name: key, column: None, first: 0, float_after_int: false, stamp: 0, seen: false });
                    fields.len() - 1
                });
                if position < self.shape.len() {
                    self.shape[position] = (key, id);
                } else {
                    self.shape.push((key, id));
                }
                id
            }
        };
        let field = &mut self.fields[id];
        if field.stamp == row {
            return Err(Outside); // a key twice in one record: Python's dict decides
        }
        field.stamp = row;
        if !field.seen {
            field.seen = true;
            out.order.push(id);
        }
        let start = v.pos;
        let head = v.head()?;
        match head {
            Head::Array(_) | Head::Map(_) => {
                v.pos = start;
                if checked {
                    v.skip_value()?;
                } else {
                    v.check_value(1)?;
                }
            }
            Head::Str(s) if !checked => {
                utf8(s)?;
            }
            _ => {}
        }
        field.observe(&head);
        if !build {
            return Ok(());
        }
        let span = (key, v.buf, start, v.pos);
        match field.column {
            Some(column) => {
                if !out.columns[column].fit(&head)? {
                    self.misfits.push((column, span));
                }
            }
            None => {
                if !matches!(head, Head::Nil) {
                    self.unknown.push(span);
                }
            }
        }
        Ok(())
    }
}
