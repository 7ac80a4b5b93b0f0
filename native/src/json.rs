//! msgpack values of the subset written as JSON text for the lake's `_extra` column.
//!
//! The rules are `logrouter.lake.extra`'s, for what the subset can hold: bin values
//! become standard base64 strings, NaN and the infinities the strings `"NaN"`,
//! `"Infinity"` and `"-Infinity"`, integers stay exact (uint64 too), nil inside a
//! value is `null`. Strings are valid UTF-8 (the reader checked) and are escaped as
//! JSON needs, non-ASCII kept as it is. Floats are written in their shortest form
//! that reads back to the same double (the text may differ from Python's `repr`,
//! `1e-7` for `1e-07`: the same number, as with orjson).

use crate::reader::{Head, Outside, Reader, R, MAX_DEPTH};
use std::io::Write;

const HEX: &[u8; 16] = b"0123456789abcdef";
const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `s` (valid UTF-8) as a JSON string.
pub fn string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    let mut start = 0;
    for (i, &b) in s.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&s[start..i]);
        if escape.is_empty() {
            out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&s[start..]);
    out.push(b'"');
}

/// `data` as a JSON string of its standard base64 (with padding).
pub fn base64(out: &mut Vec<u8>, data: &[u8]) {
    out.push(b'"');
    let mut chunks = data.chunks_exact(3);
    for c in &mut chunks {
        let n = (c[0] as u32) << 16 | (c[1] as u32) << 8 | c[2] as u32;
        out.extend_from_slice(&[
            B64[(n >> 18) as usize & 63],
            B64[(n >> 12) as usize & 63],
            B64[(n >> 6) as usize & 63],
            B64[n as usize & 63],
        ]);
    }
    match *chunks.remainder() {
        [a] => {
            let n = (a as u32) << 16;
            out.extend_from_slice(&[B64[(n >> 18) as usize & 63], B64[(n >> 12) as usize & 63], b'=', b'=']);
        }
        [a, b] => {
            let n = (a as u32) << 16 | (b as u32) << 8;
            out.extend_from_slice(&[
                B64[(n >> 18) as usize & 63],
                B64[(n >> 12) as usize & 63],
                B64[(n >> 6) as usize & 63],
                b'=',
            ]);
        }
        _ => {}
    }
    out.push(b'"');
}

pub fn float(out: &mut Vec<u8>, value: f64) {
    if value.is_nan() {
        out.extend_from_slice(b"\"NaN\"");
    } else if value.is_infinite() {
        out.extend_from_slice(if value > 0.0 { b"\"Infinity\"" } else { b"\"-Infinity\"" });
    } else {
        // Debug is the shortest text that reads back to the same double, with an
        // exponent for very large and very small magnitudes (JSON takes both forms).
        let _ = write!(out, "{:?}", value);
    }
}

fn integer(out: &mut Vec<u8>, value: i64) {
    let mut buf = [0u8; 20];
    let mut n = value.unsigned_abs();
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if value < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&buf[i..]);
}

/// One value read from `r` written as JSON; `depth` is the nesting of its container.
pub fn value(r: &mut Reader, out: &mut Vec<u8>, depth: usize) -> R<()> {
    match r.head()? {
        Head::Nil => out.extend_from_slice(b"null"),
        Head::Bool(true) => out.extend_from_slice(b"true"),
        Head::Bool(false) => out.extend_from_slice(b"false"),
        Head::Int(v) => integer(out, v),
        Head::Big(v) => {
            let _ = write!(out, "{}", v);
        }
        Head::Float(v) => float(out, v),
        Head::Str(s) => string(out, crate::reader::utf8(s)?),
        Head::Bin(b) => base64(out, b),
        Head::Array(n) => {
            if depth >= MAX_DEPTH {
                return Err(Outside);
            }
            out.push(b'[');
            for i in 0..n {
                if i > 0 {
                    out.push(b',');
                }
                value(r, out, depth + 1)?;
            }
            out.push(b']');
        }
        Head::Map(n) => {
            if depth >= MAX_DEPTH {
                return Err(Outside);
            }
            out.push(b'{');
            let mut keys = Keys::default();
            for i in 0..n {
                if i > 0 {
                    out.push(b',');
                }
                let key = r.key()?;
                keys.insert(key)?;
                string(out, key);
                out.push(b':');
                value(r, out, depth + 1)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

/// The keys of one map so far: a key seen twice is `Outside` (Python's dict would keep
/// one of them, where the text would hold both).
#[derive(Default)]
struct Keys<'a> {
    few: Vec<&'a [u8]>,
    many: Option<std::collections::HashSet<&'a [u8]>>,
}

impl<'a> Keys<'a> {
    fn insert(&mut self, key: &'a [u8]) -> R<()> {
        if let Some(set) = &mut self.many {
            return if set.insert(key) { Ok(()) } else { Err(Outside) };
        }
        if self.few.contains(&key) {
            return Err(Outside);
        }
        self.few.push(key);
        if self.few.len() > 16 {
            self.many = Some(self.few.drain(..).collect());
        }
        Ok(())
    }
}
