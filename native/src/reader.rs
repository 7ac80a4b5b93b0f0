//! A msgpack reader over one PackedForward entries blob, for the subset the native
//! path takes.
//!
//! The subset: entries `[time, map]` (a fixarray of 2) whose time is an EventTime
//! (`d7 00`, `c7 08 00`) or integer seconds inside the int64-nanosecond range, whose
//! record is a map with str keys, and whose values are nil, bool, int, float, str,
//! bin, arrays and maps with str keys, nested at most `MAX_DEPTH` deep. Every str is
//! valid UTF-8 and no map holds a key twice. Anything else — malformed, truncated or
//! merely unusual input (ext values, bin keys, invalid UTF-8, time 0 without a clock
//! reading…) — is `Outside`: the Python path, the reference, decides what it is.
//!
//! Nothing here panics on any input: every read is bounds-checked and a declared
//! count is never used to reserve memory.

/// The input is outside the native subset (or malformed): the Python path decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outside;

pub type R<T> = Result<T, Outside>;

/// Containers nested deeper than this are left to the Python path.
pub const MAX_DEPTH: usize = 32;
pub const NANOS_PER_SECOND: i64 = 1_000_000_000;
/// Whole seconds that stay inside int64 nanoseconds once scaled (forward_entries.py).
pub const MAX_SECONDS: i64 = i64::MAX / NANOS_PER_SECOND;
/// Map keys compared pairwise up to this many; a hash set beyond.
const PAIRWISE_KEYS: usize = 16;

/// Per first byte of a msgpack value: its length in bytes where that byte alone says
/// (0: `head` has to read it), and the values it holds (a fixmap's keys and values, a
/// fixarray's items), for `Reader::skip_value`.
const SKIP_BYTES: [u8; 256] = skip_table(true);
const SKIP_VALUES: [u8; 256] = skip_table(false);

const fn skip_table(bytes: bool) -> [u8; 256] {
    let mut table = [0u8; 256];
    let mut m = 0;
    while m < 256 {
        let b = m as u8;
        table[m] = match b {
            0x00..=0x7f | 0xc0 | 0xc2 | 0xc3 | 0xe0..=0xff => if bytes { 1 } else { 0 },
            0x80..=0x8f => if bytes { 1 } else { 2 * (b & 0x0f) },
            0x90..=0x9f => if bytes { 1 } else { b & 0x0f },
            0xa0..=0xbf => if bytes { 1 + (b & 0x1f) } else { 0 },
            _ => 0,
        };
        m += 1;
    }
    table
}

/// The head of one msgpack value; strings and bins are borrowed from the blob.
#[derive(Debug, Clone, Copy)]
pub enum Head<'a> {
    Nil,
    Bool(bool),
    Int(i64),
    /// A uint64 above int64's range.
    Big(u64),
    Float(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(usize),
    Map(usize),
}

pub struct Reader<'a> {
    pub buf: &'a [u8],
    pub pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    #[inline]
    pub fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }

    #[inline]
    fn byte(&mut self) -> R<u8> {
        let b = *self.buf.get(self.pos).ok_or(Outside)?;
        self.pos += 1;
        Ok(b)
    }

    #[inline]
    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        let end = self.pos.checked_add(n).ok_or(Outside)?;
        let s = self.buf.get(self.pos..end).ok_or(Outside)?;
        self.pos = end;
        Ok(s)
    }

    #[inline]
    fn be16(&mut self) -> R<u16> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }

    #[inline]
    fn be32(&mut self) -> R<u32> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }

    #[inline]
    fn be64(&mut self) -> R<u64> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_be_bytes(a))
    }

    /// The next value's head (its string or bin read whole). Ext types and the
    /// never-used byte 0xc1 are `Outside`.
    #[inline]
    pub fn head(&mut self) -> R<Head<'a>> {
        let m = self.byte()?;
        Ok(match m {
            0x00..=0x7f => Head::Int(m as i64),
            0x80..=0x8f => Head::Map((m & 0x0f) as usize),
            0x90..=0x9f => Head::Array((m & 0x0f) as usize),
            0xa0..=0xbf => Head::Str(self.take((m & 0x1f) as usize)?),
            0xc0 => Head::Nil,
            0xc2 => Head::Bool(false),
            0xc3 => Head::Bool(true),
            0xc4 => {
                let n = self.byte()? as usize;
                Head::Bin(self.take(n)?)
            }
            0xc5 => {
                let n = self.be16()? as usize;
                Head::Bin(self.take(n)?)
            }
            0xc6 => {
                let n = self.be32()? as usize;
                Head::Bin(self.take(n)?)
            }
            0xca => Head::Float(f32::from_bits(self.be32()?) as f64),
            0xcb => Head::Float(f64::from_bits(self.be64()?)),
            0xcc => Head::Int(self.byte()? as i64),
            0xcd => Head::Int(self.be16()? as i64),
            0xce => Head::Int(self.be32()? as i64),
            0xcf => {
                let v = self.be64()?;
                if v <= i64::MAX as u64 {
                    Head::Int(v as i64)
                } else {
                    Head::Big(v)
                }
            }
            0xd0 => Head::Int(self.byte()? as i8 as i64),
            0xd1 => Head::Int(self.be16()? as i16 as i64),
            0xd2 => Head::Int(self.be32()? as i32 as i64),
            0xd3 => Head::Int(self.be64()? as i64),
            0xd9 => {
                let n = self.byte()? as usize;
                Head::Str(self.take(n)?)
            }
            0xda => {
                let n = self.be16()? as usize;
                Head::Str(self.take(n)?)
            }
            0xdb => {
                let n = self.be32()? as usize;
                Head::Str(self.take(n)?)
            }
            0xdc => Head::Array(self.be16()? as usize),
            0xdd => Head::Array(self.be32()? as usize),
            0xde => Head::Map(self.be16()? as usize),
            0xdf => Head::Map(self.be32()? as usize),
            0xe0..=0xff => Head::Int(m as i8 as i64),
            _ => return Err(Outside), // 0xc1, ext types
        })
    }

    /// A map key: a str of valid UTF-8 (anything else is left to the Python path).
    #[inline]
    pub fn key(&mut self) -> R<&'a [u8]> {
        match self.head()? {
            Head::Str(s) => utf8(s),
            _ => Err(Outside),
        }
    }

    /// The time of an entry, after its `[` (0x92): nanoseconds, 0 meaning "now".
    #[inline]
    pub fn entry_time(&mut self) -> R<i64> {
        match self.buf.get(self.pos) {
            Some(0xd7) => {
                let s = self.take(10)?;
                if s[1] != 0 {
                    return Err(Outside);
                }
                Ok(event_time(&s[2..]))
            }
            Some(0xc7) => {
                let s = self.take(11)?;
                if s[1] != 8 || s[2] != 0 {
                    return Err(Outside);
                }
                Ok(event_time(&s[3..]))
            }
            _ => match self.head()? {
                Head::Int(seconds) if (-MAX_SECONDS..=MAX_SECONDS).contains(&seconds) => {
                    Ok(seconds * NANOS_PER_SECOND)
                }
                _ => Err(Outside),
            },
        }
    }

    /// The start of an entry: `[` of two, then its time (ns, 0 = now), then the
    /// record map's field count.
    #[inline]
    pub fn entry_head(&mut self) -> R<(i64, usize)> {
        if self.byte()? != 0x92 {
            return Err(Outside);
        }
        let time = self.entry_time()?;
        match self.head()? {
            Head::Map(n) => Ok((time, n)),
            _ => Err(Outside),
        }
    }

    /// Skip one value, checking it is inside the subset; `depth` is the nesting of
    /// the container holding it.
    pub fn check_value(&mut self, depth: usize) -> R<()> {
        match self.head()? {
            Head::Str(s) => {
                utf8(s)?;
            }
            Head::Array(n) => {
                if depth >= MAX_DEPTH {
                    return Err(Outside);
                }
                for _ in 0..n {
                    self.check_value(depth + 1)?;
                }
            }
            Head::Map(n) => {
                if depth >= MAX_DEPTH {
                    return Err(Outside);
                }
                self.check_map(n, depth + 1)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Skip one value of a blob `scan` took already: nothing checked again.
    pub fn skip_value(&mut self) -> R<()> {
        // The bytes most values are (fixint, fixstr, fixmap, fixarray, nil, bool) are
        // skipped by table, without a branch per kind nor a `Head`: a Filebeat
        // document's containers are mostly those, and skipping them was most of what
        // the lake build did per event.
        let buf = self.buf;
        let mut left: usize = 1;
        while left > 0 {
            left -= 1;
            let m = *buf.get(self.pos).ok_or(Outside)? as usize;
            let step = SKIP_BYTES[m] as usize;
            if step > 0 {
                self.pos += step;
                left += SKIP_VALUES[m] as usize;
                if self.pos > buf.len() {
                    return Err(Outside);
                }
                continue;
            }
            match self.head()? {
                Head::Array(n) => left = left.checked_add(n).ok_or(Outside)?,
                Head::Map(n) => left = left.checked_add(n.checked_mul(2).ok_or(Outside)?).ok_or(Outside)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Skip a map's `n` pairs (its head read), checking keys (str, once each) and values.
    pub fn check_map(&mut self, n: usize, depth: usize) -> R<()> {
        if n <= PAIRWISE_KEYS {
            let mut keys: [&[u8]; PAIRWISE_KEYS] = [&[]; PAIRWISE_KEYS];
            for i in 0..n {
                let key = self.key()?;
                if keys[..i].contains(&key) {
                    return Err(Outside);
                }
                keys[i] = key;
                self.check_value(depth)?;
            }
        } else {
            let mut keys = std::collections::HashSet::new();
            for _ in 0..n {
                let key = self.key()?;
                if !keys.insert(key) {
                    return Err(Outside);
                }
                self.check_value(depth)?;
            }
        }
        Ok(())
    }
}

#[inline]
fn event_time(s: &[u8]) -> i64 {
    let seconds = u32::from_be_bytes([s[0], s[1], s[2], s[3]]) as i64;
    let nanos = u32::from_be_bytes([s[4], s[5], s[6], s[7]]) as i64;
    seconds * NANOS_PER_SECOND + nanos // at most ~4.3e18: inside int64
}

#[inline]
pub fn utf8(s: &[u8]) -> R<&[u8]> {
    if s.is_ascii() || std::str::from_utf8(s).is_ok() {
        Ok(s)
    } else {
        Err(Outside)
    }
}

pub const HOUR_NS: i64 = 3_600_000_000_000;

/// Hours since the epoch (floor), as ``partition.hour_bucket``.
#[inline]
pub fn hour_bucket(time_ns: i64) -> i64 {
    time_ns.div_euclid(HOUR_NS)
}

/// Most hour buckets one read may spread over: a read spread over more is outside the
/// native subset (the Python path takes it).
pub const MAX_BUCKETS: usize = 1024;

/// Count one more event of `time_ns` in `buckets` (distinct hours in order of first
/// appearance, with their counts); `Outside` past `MAX_BUCKETS` hours.
#[inline]
pub fn count_hour(buckets: &mut Vec<(i64, usize)>, time_ns: i64) -> R<()> {
    let bucket = hour_bucket(time_ns);
    if let Some((_, count)) = buckets.iter_mut().find(|(known, _)| *known == bucket) {
        *count += 1;
    } else if buckets.len() >= MAX_BUCKETS {
        return Err(Outside);
    } else {
        buckets.push((bucket, 1));
    }
    Ok(())
}

/// What `scan` found in a blob of the subset.
pub struct Scan {
    pub entries: usize,
    pub needs_now: bool,
    /// Distinct hour buckets in order of first appearance, with their entry counts
    /// (time-0 entries at `now`).
    pub buckets: Vec<(i64, usize)>,
}

/// Check a whole blob is inside the subset and count its entries. Time-0 entries
/// take `now`; with none given they only set `needs_now` (the caller reads the clock
/// and scans again).
pub fn scan(blob: &[u8], now: Option<i64>) -> R<Scan> {
    let mut r = Reader::new(blob);
    let mut scan = Scan { entries: 0, needs_now: false, buckets: Vec::new() };
    while !r.at_end() {
        let (mut time, fields) = r.entry_head()?;
        r.check_map(fields, 1)?;
        scan.entries += 1;
        if time == 0 {
            scan.needs_now = true;
            match now {
                Some(now) => time = now,
                None => continue, // the caller reads the clock and scans again
            }
        }
        count_hour(&mut scan.buckets, time)?;
    }
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `skip_value` as it was before its table: a `Head` per value.
    fn skip_by_heads(r: &mut Reader) -> R<()> {
        let mut left: usize = 1;
        while left > 0 {
            left -= 1;
            match r.head()? {
                Head::Array(n) => left = left.checked_add(n).ok_or(Outside)?,
                Head::Map(n) => left = left.checked_add(n.checked_mul(2).ok_or(Outside)?).ok_or(Outside)?,
                _ => {}
            }
        }
        Ok(())
    }

    fn same_skip(buf: &[u8]) {
        let (mut fast, mut slow) = (Reader::new(buf), Reader::new(buf));
        let (a, b) = (fast.skip_value(), skip_by_heads(&mut slow));
        assert_eq!(a.is_ok(), b.is_ok(), "{buf:02x?}");
        if a.is_ok() {
            assert_eq!(fast.pos, slow.pos, "{buf:02x?}");
        }
    }

    #[test]
    fn skip_value_skips_what_the_heads_skip() {
        // Every buffer of up to two bytes, then pseudo-random ones of up to 40 bytes
        // drawn mostly from the bytes the table skips (and cut short anywhere).
        same_skip(&[]);
        for a in 0..=255u8 {
            same_skip(&[a]);
            for b in 0..=255u8 {
                same_skip(&[a, b]);
            }
        }
        let common = [0x00, 0x7f, 0x81, 0x82, 0x8f, 0x91, 0x93, 0x9f, 0xa0, 0xa1, 0xa3, 0xbf, 0xc0, 0xc1, 0xc2, 0xc3, 0xcc, 0xcd, 0xd9, 0xdc, 0xde, 0xe0, 0xff];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as usize
        };
        for _ in 0..200_000 {
            let len = next() % 41;
            let buf: Vec<u8> = (0..len).map(|_| if next() % 4 == 0 { next() as u8 } else { common[next() % common.len()] }).collect();
            same_skip(&buf);
        }
    }
}
