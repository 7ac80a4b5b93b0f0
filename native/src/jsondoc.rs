//! Beats / Log Courier JSON documents (one event each) read without Python objects.
//!
//! `scan` checks every document is a JSON object the Python path reads the same way,
//! gives each event its time by the rules of `logrouter.sources.events` (`@timestamp`,
//! else the arrival time), and transcodes the records into a PackedForward-style
//! entries blob (`[EventTime, map]` per event, `@metadata` left out when asked), which
//! the forward columns builder (`columns::run`) then reads as it reads any entries;
//! with them the JSON text of each record's top-level objects and arrays, copied from
//! the document, which that builder writes into `_extra` as it came (`columns::Texts`).
//! It also hands back the values of the fields the source needs per event (the tag
//! template's, the idempotency key's) as `Val`s.
//!
//! The subset: a top-level object; strict JSON (RFC 8259 grammar, whitespace
//! `\x20\t\n\r` only); strings of valid UTF-8 without raw control characters and without
//! a lone surrogate escape; no key twice in one object (Python keeps the last one);
//! integers inside int64; floats that stay finite; nesting at most `MAX_DEPTH` deep.
//! A `@timestamp` string in a shape the Python rules may read differently than these
//! (non-ASCII, an offset, an impossible date) and a time EventTime cannot hold (before
//! 1970-01-01T00:00:00.000000001Z or from 2106 on) are outside too. Outside means the
//! whole list goes to the Python path, the reference.

use crate::jsonparse::{Top, Val, P};
use crate::keys;
use crate::reader::{count_hour, Outside, R, NANOS_PER_SECOND};


/// How a field path is looked up (`logrouter.sources.events` / `event_keys`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Nested objects key by key.
    Walk,
    /// A top-level key holding the whole dotted name first (unless null), else `Walk`.
    DottedFirst,
}

pub struct Path {
    pub lookup: Lookup,
    pub name: Vec<u8>,
    pub keys: Vec<Vec<u8>>,
}

/// `index` as Python reads it (`DocumentEvents.texts`' first part): per spliced value its
/// `(at, start, end)`, native-endian `u32` words.
pub fn index_words(index: &[Spliced]) -> Vec<u32> {
    index.iter().flat_map(|s| [s.at, s.start, s.end]).collect()
}

/// Write `time` (ns) into the EventTime head `[0x92, 0xd7, 0x00, seconds, nanos]` an entry
/// starts with (`entry`); `Outside` for a time it cannot hold: EventTime's seconds are a
/// u32, and 0 means "now" to the entries reader.
pub fn stamp_event_time(entry: &mut [u8], time: i64) -> R<()> {
    if time <= 0 || time / NANOS_PER_SECOND > u32::MAX as i64 {
        return Err(Outside);
    }
    let seconds = (time / NANOS_PER_SECOND) as u32;
    let nanos = (time % NANOS_PER_SECOND) as u32;
    entry[3..7].copy_from_slice(&seconds.to_be_bytes());
    entry[7..11].copy_from_slice(&nanos.to_be_bytes());
    Ok(())
}

pub struct Scanned<'a> {
    pub blob: Vec<u8>,
    /// The JSON text of every top-level object or array value of the records, copied
    /// from the documents, and `index`: per such value, where its msgpack starts in
    /// `blob`, where its text starts and ends in `texts` (ascending by the first).
    pub texts: Vec<u8>,
    pub index: Vec<Spliced>,
    pub buckets: Vec<(i64, usize)>,
    /// Per path, per event.
    pub values: Vec<Vec<Val<'a>>>,
    /// Per path, per event: whether the value is the previous event's (told while both
    /// documents are in cache, so that making Python objects of them reads neither).
    pub same: Vec<Vec<bool>>,
    /// Per event, with `Options::key`: its key's digest, or None where it has no key.
    pub digests: Vec<Option<[u8; keys::DIGEST_BYTES]>>,
}

/// What `scan_with` does besides `scan`.
#[derive(Default)]
pub struct Options<'a, 's> {
    /// A buffer every document lies in: `texts` then stays empty and `index` points
    /// into that buffer instead.
    pub within: Option<&'a [u8]>,
    /// An idempotency key made of the values of the paths from the given one on.
    pub key: Option<(&'s keys::Spec, usize)>,
}

/// A top-level container of a record: its msgpack's offset in the entries blob and its
/// JSON text's span in `Scanned::texts` (`columns::Texts` reads these as u32 triples).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spliced {
    pub at: u32,
    pub start: u32,
    pub end: u32,
}

const TIMESTAMP: &[u8] = b"@timestamp";


// -- event time (logrouter.sources.events.timestamp_ns and _time_of) ---------------------

const MIN_SECONDS: i64 = -9_223_372_035; // events._MIN_SECONDS
const MAX_SECONDS: i64 = 9_223_372_035; // events._MAX_SECONDS

fn digits(s: &[u8]) -> Option<i64> {
    let mut v = 0i64;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + (c - b'0') as i64;
    }
    Some(v)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `@timestamp`'s time in ns, `Ok(None)` where Python gives the arrival time, `Outside`
/// where the Python rules might read it otherwise than these.
pub fn stamp_time(t: &[u8]) -> R<Option<i64>> {
    if !t.is_ascii() {
        return Err(Outside);
    }
    let n = t.len();
    if n >= 20 && matches!(t[n - 1], b'Z' | b'z') {
        let p = &t[..19];
        if !(p[4] == b'-' && p[7] == b'-' && matches!(p[10], b'T' | b't' | b' ') && p[13] == b':' && p[16] == b':') {
            return Ok(None);
        }
        let field = |a: usize, b: usize| digits(&p[a..b]).ok_or(Outside);
        let (y, mo, d, h, mi, s) = (field(0, 4)?, field(5, 7)?, field(8, 10)?, field(11, 13)?, field(14, 16)?, field(17, 19)?);
        let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let month_days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        if y < 1 || !(1..=12).contains(&mo) || d < 1 || d > month_days[(mo - 1) as usize] || h > 23 || mi > 59 || s > 59 {
            return Err(Outside); // fromisoformat refuses it (arrival time): not worth the risk
        }
        let seconds = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s;
        if !(MIN_SECONDS..=MAX_SECONDS).contains(&seconds) {
            return Ok(None);
        }
        let fraction = &t[19..n - 1];
        if fraction.is_empty() {
            return Ok(Some(seconds * NANOS_PER_SECOND));
        }
        if fraction[0] != b'.' || fraction.len() < 2 || !fraction[1..].iter().all(u8::is_ascii_digit) {
            return Ok(None);
        }
        let kept = &fraction[1..fraction.len().min(10)];
        let scale = 10i64.pow(9 - kept.len() as u32);
        return Ok(Some(seconds * NANOS_PER_SECOND + digits(kept).ok_or(Outside)? * scale));
    }
    if n < 4 || !t[..4].iter().all(u8::is_ascii_digit) {
        return Ok(None); // fromisoformat wants four digits of year first
    }
    Err(Outside) // offsets and other ISO forms: datetime.fromisoformat decides
}

/// The values at `paths` in the record whose top-level members are `top`, pushed onto
/// `columns` (one per path). Each nested object a path enters is read once for all the
/// paths that enter it (Filebeat's keys read `agent`, `log` and `@metadata` twice each).
fn lookups<'a>(doc: &'a [u8], top: &Top<'a>, paths: &[Path], columns: &mut [Vec<Val<'a>>], same: &mut [Vec<bool>], work: &mut Lookups) -> R<()> {
    let member = |name: &[u8]| top.members.iter().find(|(k, ..)| &**k == name);
    work.nested.clear();
    for (i, path) in paths.iter().enumerate() {
        columns[i].push(Val::Missing);
        if path.lookup == Lookup::DottedFirst && path.keys.len() > 1 {
            if let Some((_, _, _, v)) = member(&path.name) {
                if *v != Val::Missing {
                    *columns[i].last_mut().expect("pushed") = v.clone();
                    continue;
                }
            }
        }
        if let Some((_, start, _, first)) = member(&path.keys[0]) {
            if path.keys.len() == 1 {
                *columns[i].last_mut().expect("pushed") = first.clone();
            } else if *first == Val::Container {
                work.nested.push((*start, i));
            }
        }
    }
    // Paths entering the same top-level member together (same start), in one walk.
    work.nested.sort_unstable();
    let nested = std::mem::take(&mut work.nested);
    let mut from = 0;
    while from < nested.len() {
        let start = nested[from].0;
        let to = from + nested[from..].iter().take_while(|(s, _)| *s == start).count();
        let mut group = Group::default();
        nested[from..to].iter().for_each(|&(_, i)| group.push(i));
        walk(doc, start, 1, group.as_slice(), paths, columns, &mut work.scratch)?;
        from = to;
    }
    work.nested = nested;
    for (column, same) in columns.iter().zip(same.iter_mut()) {
        let n = column.len();
        same.push(n > 1 && column[n - 1] == column[n - 2]);
    }
    Ok(())
}

/// Path indices, on the stack up to 8 (a key's six paths and a tag's), else on the heap.
#[derive(Default)]
struct Group {
    few: [usize; 8],
    n: usize,
    many: Vec<usize>,
}

impl Group {
    fn push(&mut self, i: usize) {
        if self.n < self.few.len() {
            self.few[self.n] = i;
        } else {
            if self.many.is_empty() {
                self.many.extend_from_slice(&self.few);
            }
            self.many.push(i);
        }
        self.n += 1;
    }

    fn as_slice(&self) -> &[usize] {
        if self.n <= self.few.len() {
            &self.few[..self.n]
        } else {
            &self.many
        }
    }
}

/// Reusable buffers of `lookups`.
#[derive(Default)]
struct Lookups {
    nested: Vec<(usize, usize)>,
    scratch: Vec<u8>,
}

/// Find the `depth`th key of each path of `group` (indices into `paths`) in the object
/// (if it is one) at `start` of `doc`, which was checked whole already; set the value
/// of those that end there, walk on for those that go deeper.
fn walk<'a>(doc: &'a [u8], start: usize, depth: usize, group: &[usize], paths: &[Path], columns: &mut [Vec<Val<'a>>], scratch: &mut Vec<u8>) -> R<()> {
    let mut p = P::at(doc, start); // `doc` passed `P::new` in `document`
    if p.peek()? != b'{' {
        return Ok(());
    }
    p.i += 1;
    p.skip_ws();
    if p.peek()? == b'}' {
        return Ok(());
    }
    let mut left = group.len();
    loop {
        p.skip_ws();
        p.expect(b'"')?;
        let key: std::borrow::Cow<'a, [u8]> = match p.string(scratch)? {
            Some(raw) => raw.into(),
            None => scratch.clone().into(),
        };
        p.skip_ws();
        p.expect(b':')?;
        p.skip_ws();
        let at = p.i;
        // The paths of `group` that name this member: ending here, or going deeper.
        let (mut ends, mut deeper) = (Group::default(), Group::default());
        for &i in group {
            let keys = &paths[i].keys;
            if keys[depth] == *key {
                if keys.len() == depth + 1 {
                    ends.push(i);
                } else {
                    deeper.push(i);
                }
            }
        }
        let (ends, deeper) = (ends.as_slice(), deeper.as_slice());
        if !ends.is_empty() || !deeper.is_empty() {
            // Keys are unique (the document was checked): this member is the only match.
            if let Some((&first, rest)) = ends.split_first() {
                let v = p.value(&mut None, scratch, 1)?;
                for &i in rest {
                    *columns[i].last_mut().expect("pushed") = v.clone();
                }
                *columns[first].last_mut().expect("pushed") = v;
            } else {
                p.skip_value()?;
            }
            if !deeper.is_empty() {
                walk(doc, at, depth + 1, deeper, paths, columns, scratch)?;
            }
            left -= ends.len() + deeper.len();
            if left == 0 {
                return Ok(());
            }
        } else {
            p.skip_value()?;
        }
        p.skip_ws();
        if p.peek()? == b',' {
            p.i += 1;
        } else {
            return Ok(());
        }
    }
}

/// One document: its record as msgpack into `blob` (after the entry's head, which the
/// caller writes once the time is known), its time, and the paths' values.
fn document<'a>(doc: &'a [u8], now: i64, paths: &[Path], out: &mut Scanned<'a>, work: &mut Work<'a, '_>) -> R<i64> {
    let blob = &mut out.blob;
    let (p, top) = (&mut work.p, &mut work.top);
    p.restart(doc)?;
    p.skip_ws();
    p.expect(b'{')?;
    let head = blob.len();
    blob.extend_from_slice(&[0x92, 0xd7, 0x00, 0, 0, 0, 0, 0, 0, 0, 0]);
    top.members.clear();
    top.containers.clear();
    p.object(&mut Some(blob), &mut work.lookups.scratch, 1, Some(top))?;
    p.skip_ws();
    if p.i != doc.len() {
        return Err(Outside);
    }
    let mut time = now;
    if let Some((_, _, _, stamp)) = top.members.iter().find(|(k, ..)| &**k == TIMESTAMP) {
        let found = match stamp {
            Val::Str(s) => stamp_time(s)?,
            Val::Owned(s) => stamp_time(s)?,
            _ => None,
        };
        if let Some(t) = found {
            time = t;
        }
    }
    stamp_event_time(&mut blob[head..], time)?;
    let offset = |n: usize| u32::try_from(n).map_err(|_| Outside); // a read of 4 GiB: Python's
    match work.within {
        // The text where it lies in the buffer holding every document: no copy.
        Some(buffer) => {
            let base = doc.as_ptr() as usize - buffer.as_ptr() as usize;
            for &(at, start, end) in &top.containers {
                out.index.push(Spliced { at: offset(at)?, start: offset(base + start)?, end: offset(base + end)? });
            }
        }
        None => {
            for &(at, start, end) in &top.containers {
                let from = out.texts.len();
                out.texts.extend_from_slice(&doc[start..end]);
                out.index.push(Spliced { at: offset(at)?, start: offset(from)?, end: offset(out.texts.len())? });
            }
        }
    }
    lookups(doc, top, paths, &mut out.values, &mut out.same, &mut work.lookups)?;
    if let Some((spec, first)) = work.key {
        let e = out.values[first].len() - 1;
        let columns = &out.values[first..];
        let digest = if columns.len() <= 16 {
            let mut row = [&Val::Missing; 16];
            for (slot, column) in row.iter_mut().zip(columns) {
                *slot = &column[e];
            }
            keys::event_key(spec, &row[..columns.len()], &mut work.lookups.scratch)
        } else {
            let row: Vec<&Val> = columns.iter().map(|c| &c[e]).collect();
            keys::event_key(spec, &row, &mut work.lookups.scratch)
        };
        out.digests.push(digest);
    }
    Ok(time)
}

/// What `document` reuses from one document to the next: the reader, the top-level
/// members, the lookups' buffers (a read of thousands of events allocates them once).
struct Work<'a, 's> {
    p: P<'a>,
    top: Top<'a>,
    lookups: Lookups,
    within: Option<&'a [u8]>,
    key: Option<(&'s keys::Spec, usize)>,
}

thread_local! {
    /// The buffers of this thread's last scan, handed back (`Scanned::recycle`) once
    /// copied out: a read's megabyte of output then lands on pages already mapped
    /// instead of faulting in fresh ones every time.
    static SPARE: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Buffers kept for the next scan at most this big (a rare huge read's are freed).
const SPARE_BYTES: usize = 16 << 20;

impl Scanned<'_> {
    /// Give this scan's output buffers to the next scan on this thread.
    pub fn recycle(self) {
        let (mut blob, mut texts) = (self.blob, self.texts);
        if blob.capacity() + texts.capacity() <= SPARE_BYTES {
            blob.clear();
            texts.clear();
            SPARE.with(|spare| *spare.borrow_mut() = (blob, texts));
        }
    }
}

/// Scan every document (see the module's docs), `now` being the arrival time.
pub fn scan<'a>(documents: &[&'a [u8]], now: i64, drop_metadata: bool, paths: &[Path]) -> R<Scanned<'a>> {
    scan_with(documents, now, drop_metadata, paths, &Options::default())
}

/// `scan`, and what `options` asks.
pub fn scan_with<'a>(documents: &[&'a [u8]], now: i64, drop_metadata: bool, paths: &[Path], options: &Options<'a, '_>) -> R<Scanned<'a>> {
    let within = options.within;
    if options.key.is_some_and(|(_, first)| first >= paths.len()) {
        return Err(Outside);
    }
    if let Some(buffer) = within {
        let range = buffer.as_ptr_range();
        if !documents.iter().all(|d| range.start <= d.as_ptr() && d.as_ptr_range().end <= range.end) {
            return Err(Outside);
        }
    }
    let total: usize = documents.iter().map(|d| d.len()).sum();
    let (mut blob, mut texts) = SPARE.with(|spare| std::mem::take(&mut *spare.borrow_mut()));
    blob.reserve(total);
    if within.is_none() {
        texts.reserve(total);
    }
    let mut out = Scanned {
        blob,
        texts,
        index: Vec::with_capacity(documents.len() * 8),
        buckets: Vec::new(),
        values: paths.iter().map(|_| Vec::with_capacity(documents.len())).collect(),
        same: paths.iter().map(|_| Vec::with_capacity(documents.len())).collect(),
        digests: Vec::with_capacity(if options.key.is_some() { documents.len() } else { 0 }),
    };
    let mut work = Work {
        p: P::at(b"", 0),
        top: Top { drop_metadata, members: Vec::new(), containers: Vec::new() },
        lookups: Lookups::default(),
        within,
        key: options.key,
    };
    for doc in documents {
        let time = document(doc, now, paths, &mut out, &mut work)?;
        count_hour(&mut out.buckets, time)?;
    }
    Ok(out)
}

/// Whether every document is inside the subset (no output, no time rules).
pub fn check(documents: &[&[u8]]) -> bool {
    let mut scratch = Vec::new();
    documents.iter().all(|doc| {
        let Ok(mut p) = P::new(doc) else {
            return false;
        };
        p.skip_ws();
        if p.expect(b'{').is_err() || p.object(&mut None, &mut scratch, 1, None).is_err() {
            return false;
        }
        p.skip_ws();
        p.i == doc.len()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps() {
        assert_eq!(stamp_time(b"1970-01-01T00:00:01.5Z"), Ok(Some(1_500_000_000)));
        assert_eq!(stamp_time(b"2024-01-02T03:04:05Z"), Ok(Some(1_704_164_645_000_000_000)));
        assert_eq!(stamp_time(b"hello"), Ok(None));
        assert_eq!(stamp_time(b"2024-01-02T03:04:05.Z"), Ok(None));
        assert!(stamp_time(b"2024-02-30T03:04:05Z").is_err());
    }

    #[test]
    fn transcodes() {
        let docs: Vec<&[u8]> = vec![br#"{"a":1,"b":[true,null,"x\u00e9"],"@metadata":{"beat":"f"}}"#];
        let paths = vec![Path { lookup: Lookup::Walk, name: b"@metadata.beat".to_vec(), keys: vec![b"@metadata".to_vec(), b"beat".to_vec()] }];
        let s = scan(&docs, 5_000_000_000, true, &paths).unwrap();
        assert_eq!(s.values[0][0], Val::Str(b"f"));
        assert_eq!(s.buckets, vec![(0, 1)]);
        assert!(!check(&[br#"{"a":1,"a":2}"#]));
        assert!(!check(&[br#"{"a":"\ud800"}"#]));
        assert!(!check(&[br#"[1]"#]));
        // A lookup skips the members before the one it wants: strings holding brackets
        // and escaped quotes, nested arrays and objects, scalars.
        let docs: Vec<&[u8]> = vec![br#"{"a":{"s":"x\"}]","n":[1,{"b":2},"]"],"t":true,"f":-1.5e3,"b":{"c":"d\u00e9"}}}"#];
        let keys = vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()];
        let paths = vec![Path { lookup: Lookup::Walk, name: b"a.b.c".to_vec(), keys }];
        let s = scan(&docs, 5_000_000_000, true, &paths).unwrap();
        assert_eq!(s.values[0][0], Val::Owned("dé".as_bytes().to_vec()));
    }

    #[test]
    fn lookups_skip_strings_eight_bytes_at_a_time() {
        // An escaped quote or backslash at every place of a chunk of a skipped member.
        for n in 0..20 {
            let pad = "x".repeat(n);
            let doc = format!(r#"{{"a":{{"s":"{pad}\"{pad}\\","t":["{pad}\\\"",{{"u":"{pad}"}}],"b":{n}}}}}"#);
            let paths = vec![Path { lookup: Lookup::Walk, name: b"a.b".to_vec(), keys: vec![b"a".to_vec(), b"b".to_vec()] }];
            let s = scan(&[doc.as_bytes()], 5_000_000_000, false, &paths).unwrap();
            assert_eq!(s.values[0][0], Val::Int(n as i64), "{doc}");
        }
    }

    #[test]
    fn keys_twice_with_the_same_fingerprint() {
        // Same length and first eight bytes: told apart by the rest; a key twice found
        // however long, and past the sixteen compared pairwise.
        assert!(check(&[br#"{"abcdefgh1":1,"abcdefgh2":2,"a":{"abcdefgh1":1,"abcdefgh2":2}}"#]));
        assert!(!check(&[br#"{"abcdefgh1":1,"x":2,"abcdefgh1":3}"#]));
        assert!(!check(&[br#"{"a":{"abcdefghij":1,"abcdefghij":2}}"#]));
        let many: String = (0..20).map(|i| format!(r#""k{i}":{i},"#)).collect();
        assert!(check(&[format!("{{{many}\"z\":0}}").as_bytes()]));
        assert!(!check(&[format!("{{{many}\"k3\":0}}").as_bytes()]));
        assert!(!check(&[format!("{{{many}\"k19\":0}}").as_bytes()]));
    }

    #[test]
    fn strings_eight_bytes_at_a_time() {
        // A quote, backslash, control character or bad UTF-8 at every place of a chunk.
        for n in 0..20 {
            let pad = "x".repeat(n);
            let good = format!(r#"{{"k{pad}":"{pad}\"{pad}","é{pad}":"{pad}ü"}}"#);
            assert!(check(&[good.as_bytes()]), "{good}");
            for bad in [0x01u8, 0x1f, 0xff, 0xc3] {
                let raw = [&br#"{"k":""#[..], pad.as_bytes(), &[bad], pad.as_bytes(), br#""}"#].concat();
                assert!(!check(&[&raw]), "{raw:?}");
            }
        }
    }
}
