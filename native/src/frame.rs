//! Where the entries of a blob received in pieces end, as msgpack's streaming unpacker
//! sees them.
//!
//! A big forward message is decoded in parts (`logrouter/wire/forward_offload.py`), and a
//! part ends where msgpack-python's `Unpacker.tell()` has passed the part's size after a
//! step of input: a resend must split the same way whichever path decodes it. `frame`
//! walks msgpack values without building or checking them and says where the last
//! complete entry ends and what `tell()` would answer for the same bytes: the C
//! unpacker consumes a value's head byte at once, but a fixed-size trail (a length
//! field, a number, a str/bin/ext body) only once all of its bytes are there.
//!
//! It walks iteratively (no recursion) and reads nothing past the buffer.

/// What `frame` found: `end`, the end of the last complete entry (0: none), and `tell`,
/// where the unpacker would stand after all of the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framed {
    pub end: usize,
    pub tell: usize,
}

/// The next token of the value at `pos`: where it ends and how many values it holds.
/// Err(tell) when the buffer ends inside it.
#[inline]
fn token(buf: &[u8], pos: usize) -> Result<Option<(usize, u64)>, usize> {
    let m = buf[pos];
    let after = pos + 1;
    // A fixed trail of `n` bytes at `at`: the unpacker waits for all of them.
    let trail = |at: usize, n: usize| -> Result<usize, usize> {
        if buf.len() - at < n {
            Err(at)
        } else {
            Ok(at + n)
        }
    };
    let length = |n: usize| -> Result<(usize, u64), usize> {
        let end = trail(after, n)?;
        let mut v: u64 = 0;
        for &b in &buf[after..end] {
            v = (v << 8) | b as u64;
        }
        Ok((end, v))
    };
    Ok(Some(match m {
        0x00..=0x7f | 0xc0 | 0xc2 | 0xc3 | 0xe0..=0xff => (after, 0),
        0x80..=0x8f => (after, 2 * (m & 0x0f) as u64),
        0x90..=0x9f => (after, (m & 0x0f) as u64),
        0xa0..=0xbf => (trail(after, (m & 0x1f) as usize)?, 0),
        0xc4 | 0xd9 => {
            let (at, n) = length(1)?;
            (trail(at, n as usize)?, 0)
        }
        0xc5 | 0xda => {
            let (at, n) = length(2)?;
            (trail(at, n as usize)?, 0)
        }
        0xc6 | 0xdb => {
            let (at, n) = length(4)?;
            (trail(at, n as usize)?, 0)
        }
        // ext: its type byte and data are one trail
        0xc7 => {
            let (at, n) = length(1)?;
            (trail(at, n as usize + 1)?, 0)
        }
        0xc8 => {
            let (at, n) = length(2)?;
            (trail(at, n as usize + 1)?, 0)
        }
        0xc9 => {
            let (at, n) = length(4)?;
            (trail(at, n as usize + 1)?, 0)
        }
        0xca | 0xce | 0xd2 => (trail(after, 4)?, 0),
        0xcb | 0xcf | 0xd3 => (trail(after, 8)?, 0),
        0xcc | 0xd0 => (trail(after, 1)?, 0),
        0xcd | 0xd1 => (trail(after, 2)?, 0),
        0xd4 => (trail(after, 2)?, 0),
        0xd5 => (trail(after, 3)?, 0),
        0xd6 => (trail(after, 5)?, 0),
        0xd7 => (trail(after, 9)?, 0),
        0xd8 => (trail(after, 17)?, 0),
        0xdc => length(2)?,
        0xdd => length(4)?,
        0xde => {
            let (at, n) = length(2)?;
            (at, 2 * n)
        }
        0xdf => {
            let (at, n) = length(4)?;
            (at, 2 * n)
        }
        _ => return Ok(None), // 0xc1
    }))
}

/// Containers nested deeper than this (non-empty ones, as msgpack's unpacker counts
/// them) are left to the Python path.
pub const MAX_NESTING: usize = 64;

/// Walk the top-level values (entries) of `buf`. None at a byte msgpack refuses, at an
/// entry whose first byte is no array head that can hold a pair (`0x92`, array16,
/// array32: anything else is no event, and the bomb rule counts it) or at nesting
/// deeper than `MAX_NESTING`: the caller's Python path says what it is.
pub fn frame(buf: &[u8]) -> Option<Framed> {
    let mut pos = 0;
    let mut end = 0;
    // Values still to read in each open (non-empty) container of the entry being walked.
    let mut open = [0u64; MAX_NESTING];
    let mut depth = 0;
    while pos < buf.len() {
        if depth == 0 && !matches!(buf[pos], 0x92 | 0xdc | 0xdd) {
            return None;
        }
        match token(buf, pos) {
            Ok(Some((next, held))) => {
                pos = next;
                if held > 0 {
                    if depth == MAX_NESTING {
                        return None;
                    }
                    open[depth] = held;
                    depth += 1;
                    continue;
                }
                // A value complete: so may be the containers it ends.
                loop {
                    if depth == 0 {
                        end = pos;
                        break;
                    }
                    open[depth - 1] -= 1;
                    if open[depth - 1] > 0 {
                        break;
                    }
                    depth -= 1;
                }
            }
            Ok(None) => return None,
            Err(tell) => return Some(Framed { end, tell }),
        }
    }
    Some(Framed { end, tell: pos })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_tell() {
        // [1, {"a": "xy"}] twice, then a str8 cut in its body
        let entry = [0x92, 0x01, 0x81, 0xa1, b'a', 0xa2, b'x', b'y'];
        let mut buf = entry.to_vec();
        buf.extend_from_slice(&entry);
        assert_eq!(frame(&buf), Some(Framed { end: 16, tell: 16 }));
        buf.extend_from_slice(&[0x92, 0x01, 0xd9, 0x05, b'a']);
        assert_eq!(frame(&buf), Some(Framed { end: 16, tell: 20 }));
        buf.truncate(19); // the str8's length byte is missing
        assert_eq!(frame(&buf), Some(Framed { end: 16, tell: 19 }));
        assert_eq!(frame(&[0x92, 0xc1]), None);
        assert_eq!(frame(&[0x01]), None); // no pair
        assert_eq!(frame(&[0xdd, 0xff, 0xff, 0xff, 0xff]), Some(Framed { end: 0, tell: 5 }));
        assert_eq!(frame(&[0x92, 0x90, 0x80]), Some(Framed { end: 3, tell: 3 })); // empty containers
        let mut deep = vec![0x92];
        deep.extend(std::iter::repeat(0x91).take(MAX_NESTING));
        assert_eq!(frame(&deep), None);
    }
}
