//! Where the PackedForward messages of a forward connection's msgpack stream are, read
//! from the received bytes without building anything.
//!
//! `logrouter/wire/forward_framing.py` (`MsgpackFramer`) is the reference. This takes
//! only the shape fluentd's `out_forward` and Fluent Bit send: `[tag, blob]` or
//! `[tag, blob, options]` (fixarray), tag and blob a str or bin, options nil or a fixmap
//! of str keys and scalar values (nil, booleans, numbers, str, bin). For each such
//! message it says where its tag, blob and options lie, so the blob is sliced out of the
//! received bytes once. It stops at the first message of any other shape, or one that
//! cannot fit in the size limit (`Stop::Python`): the Python framer takes the stream
//! from that message's first byte and says what it is, errors included. A message of
//! the shape, cut by the end of the bytes, is waited for (`Stop::Wait`): no byte of it
//! so far is one msgpack's unpacker would refuse, and it fits in the limit.

/// A whole message: its bytes, its tag's and blob's bodies, its options value (None for
/// a two-element message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packed {
    pub start: usize,
    pub end: usize,
    pub tag: (usize, usize),
    pub blob: (usize, usize),
    pub options: Option<(usize, usize)>,
}

/// Why the walk stopped where it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// A message of the shape is cut: nothing to do until the bytes reach this length.
    Wait(usize),
    /// The Python framer takes the stream from here.
    Python,
}

enum Str {
    Body(usize, usize),
    Short,
    Other,
}

fn be(buf: &[u8], at: usize, n: usize) -> usize {
    buf[at..at + n].iter().fold(0usize, |v, &b| (v << 8) | b as usize)
}

/// The body of the str (or, unless `str_only`, bin) whose header is at `pos`.
fn string_at(buf: &[u8], pos: usize, str_only: bool) -> Str {
    let Some(&m) = buf.get(pos) else { return Str::Short };
    let width = match m {
        0xa0..=0xbf => return Str::Body(pos + 1, pos + 1 + (m & 0x1f) as usize),
        0xd9 => 1,
        0xda => 2,
        0xdb => 4,
        0xc4 if !str_only => 1,
        0xc5 if !str_only => 2,
        0xc6 if !str_only => 4,
        _ => return Str::Other,
    };
    if buf.len() < pos + 1 + width {
        return Str::Short;
    }
    let at = pos + 1 + width;
    Str::Body(at, at + be(buf, pos + 1, width))
}

/// Where a scalar option value at `pos` ends; None for anything else.
fn scalar_end(buf: &[u8], pos: usize) -> Option<Result<usize, ()>> {
    let m = *buf.get(pos)?;
    let size = match m {
        0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 1,
        0xcc | 0xd0 => 2,
        0xcd | 0xd1 => 3,
        0xca | 0xce | 0xd2 => 5,
        0xcb | 0xcf | 0xd3 => 9,
        _ => {
            return match string_at(buf, pos, false) {
                Str::Body(_, end) => Some(Ok(end)),
                Str::Short => None,
                Str::Other => Some(Err(())),
            }
        }
    };
    Some(Ok(pos + size))
}

/// The message starting at `s` (`s < buf.len()`).
fn message(buf: &[u8], s: usize, limit: usize) -> Result<Packed, Stop> {
    let most = s.saturating_add(limit); // the furthest a message may end
    // Wait for `need` bytes, unless the message cannot fit: Python then says so.
    let wait = |need: usize| if need > most { Stop::Python } else { Stop::Wait(need) };
    let head = buf[s];
    if head != 0x92 && head != 0x93 {
        return Err(Stop::Python);
    }
    let tag = match string_at(buf, s + 1, false) {
        Str::Body(a, b) if b <= most => (a, b),
        Str::Short => return Err(wait(buf.len() + 1)),
        _ => return Err(Stop::Python),
    };
    let blob = match string_at(buf, tag.1, false) {
        Str::Body(a, b) if b <= most => (a, b),
        Str::Short => return Err(wait(buf.len().max(tag.1) + 1)),
        _ => return Err(Stop::Python),
    };
    let mut end = blob.1;
    if head == 0x92 {
        if buf.len() < end {
            return Err(wait(end));
        }
        return Ok(Packed { start: s, end, tag, blob, options: None });
    }
    if buf.len() <= end {
        return Err(wait(end + 1));
    }
    let at = end;
    match buf[at] {
        0xc0 => end += 1,
        m @ 0x80..=0x8f => {
            end += 1;
            for _ in 0..(m & 0x0f) {
                end = match string_at(buf, end, true) {
                    Str::Body(_, b) if b <= most => b,
                    Str::Short => return Err(wait(buf.len() + 1)),
                    _ => return Err(Stop::Python),
                };
                if buf.len() < end {
                    return Err(wait(end));
                }
                end = match scalar_end(buf, end) {
                    Some(Ok(b)) if b <= most => b,
                    None => return Err(wait(buf.len() + 1)),
                    _ => return Err(Stop::Python),
                };
                if buf.len() < end {
                    return Err(wait(end));
                }
            }
        }
        _ => return Err(Stop::Python),
    }
    if buf.len() < end {
        return Err(wait(end));
    }
    Ok(Packed { start: s, end, tag, blob, options: Some((at, end)) })
}

/// The whole messages of the shape at the start of `buf`, where they end, and why the
/// walk stopped there (`Wait(len + 1)` when it used every byte).
pub fn packed_messages(buf: &[u8], limit: usize) -> (Vec<Packed>, usize, Stop) {
    let mut found = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        match message(buf, pos, limit) {
            Ok(m) => {
                pos = m.end;
                found.push(m);
            }
            Err(stop) => return (found, pos, stop),
        }
    }
    (found, pos, Stop::Wait(pos + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        // ["t", bin8 "ab", {"k": 1}]
        let m = [0x93, 0xa1, b't', 0xc4, 0x02, b'a', b'b', 0x81, 0xa1, b'k', 0x01];
        let (found, used, stop) = packed_messages(&m, 100);
        assert_eq!(used, m.len());
        assert_eq!(stop, Stop::Wait(m.len() + 1));
        assert_eq!(found[0].tag, (2, 3));
        assert_eq!(found[0].blob, (5, 7));
        assert_eq!(found[0].options, Some((7, 11)));
        for cut in 1..m.len() {
            let (found, used, stop) = packed_messages(&m[..cut], 100);
            assert!(found.is_empty() && used == 0 && matches!(stop, Stop::Wait(n) if n > cut), "{cut}");
        }
        assert_eq!(packed_messages(&m, 10).2, Stop::Python); // too big for the limit
        assert_eq!(packed_messages(&[0xc0], 100).2, Stop::Python); // a heartbeat
        assert_eq!(packed_messages(&[0x92, 0xa1, b't', 0x90], 100).2, Stop::Python); // Forward mode
        // a declared blob longer than the limit: at once
        assert_eq!(packed_messages(&[0x92, 0xa1, b't', 0xdb, 0, 1, 0, 0], 1000).2, Stop::Python);
    }
}
