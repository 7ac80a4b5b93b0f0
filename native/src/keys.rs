//! Beats idempotency keys from the scanned values (`logrouter.sources.event_keys`).
//!
//! A key is the event's sender (`agent.id`'s text, else empty) and 16 bytes of BLAKE2b
//! over the msgpack of a tuple of its values, as `event_keys` makes it: msgspec's
//! encoding (the shortest array, str and int heads, floats as float64), so a key does
//! not depend on which path made it. `"auto"`: `("id", @metadata._id)` for a non-empty
//! id string, else `("line", agent.ephemeral_id, log.file.path, log.offset,
//! @timestamp)` when those are strings and an integer; a field list: `(name, *values)`
//! when every value is a scalar. Otherwise the event has no key. The scan makes each
//! event's key right after reading it (`jsondoc::scan_with`), its bytes still in cache.

use blake2::digest::{Update, VariableOutput};
use blake2::Blake2bVar;

use crate::jsonparse::{write_str, Val};

pub const DIGEST_BYTES: usize = 16;

pub enum Spec {
    /// The columns: `@metadata._id`, `log.offset`, `log.file.path`,
    /// `agent.ephemeral_id`, `@timestamp`, `agent.id` (`event_keys._AUTO_PATHS`).
    Auto,
    /// The key's name (`"fields:" + "\0".join(paths)`); the columns: the fields', then
    /// `agent.id`.
    Fields(Vec<u8>),
}

fn array_head(o: &mut Vec<u8>, n: usize) {
    if n < 16 {
        o.push(0x90 | n as u8);
    } else if n < 65536 {
        o.push(0xdc);
        o.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        o.push(0xdd);
        o.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

fn int_value(o: &mut Vec<u8>, i: i64) {
    if i >= 0 {
        let u = i as u64;
        if u < 128 {
            o.push(u as u8);
        } else if u < 256 {
            o.extend_from_slice(&[0xcc, u as u8]);
        } else if u < 65536 {
            o.push(0xcd);
            o.extend_from_slice(&(u as u16).to_be_bytes());
        } else if u < 1 << 32 {
            o.push(0xce);
            o.extend_from_slice(&(u as u32).to_be_bytes());
        } else {
            o.push(0xcf);
            o.extend_from_slice(&u.to_be_bytes());
        }
    } else if i >= -32 {
        o.push(i as i8 as u8);
    } else if i >= -128 {
        o.extend_from_slice(&[0xd0, i as i8 as u8]);
    } else if i >= -32768 {
        o.push(0xd1);
        o.extend_from_slice(&(i as i16).to_be_bytes());
    } else if i >= -(1 << 31) {
        o.push(0xd2);
        o.extend_from_slice(&(i as i32).to_be_bytes());
    } else {
        o.push(0xd3);
        o.extend_from_slice(&i.to_be_bytes());
    }
}

fn text<'v>(v: &'v Val<'_>) -> Option<&'v [u8]> {
    match v {
        Val::Str(s) => Some(s),
        Val::Owned(s) => Some(s),
        _ => None,
    }
}

/// A scalar's msgpack; false for None, an object or an array.
fn scalar(o: &mut Vec<u8>, v: &Val) -> bool {
    match v {
        Val::Bool(b) => o.push(if *b { 0xc3 } else { 0xc2 }),
        Val::Int(i) => int_value(o, *i),
        Val::Float(f) => {
            o.push(0xcb);
            o.extend_from_slice(&f.to_bits().to_be_bytes());
        }
        Val::Str(s) => write_str(o, s),
        Val::Owned(s) => write_str(o, s),
        Val::Missing | Val::Container => return false,
    }
    true
}

/// The key material of one event (the tuple's msgpack) into `o`; false: no key.
fn material(spec: &Spec, row: &[&Val], o: &mut Vec<u8>) -> bool {
    o.clear();
    match spec {
        Spec::Auto => {
            let [id, offset, path, ephemeral, stamp, _] = row else { return false };
            if let Some(id) = text(id).filter(|s| !s.is_empty()) {
                array_head(o, 2);
                write_str(o, b"id");
                write_str(o, id);
                return true;
            }
            let (Val::Int(offset), Some(path), Some(ephemeral), Some(stamp)) = (offset, text(path), text(ephemeral), text(stamp)) else {
                return false;
            };
            array_head(o, 5);
            write_str(o, b"line");
            write_str(o, ephemeral);
            write_str(o, path);
            int_value(o, *offset);
            write_str(o, stamp);
            true
        }
        Spec::Fields(name) => {
            let values = &row[..row.len() - 1];
            array_head(o, 1 + values.len());
            write_str(o, name);
            values.iter().all(|v| scalar(o, v))
        }
    }
}

pub fn digest(data: &[u8]) -> [u8; DIGEST_BYTES] {
    let mut hasher = Blake2bVar::new(DIGEST_BYTES).expect("16 is a BLAKE2b digest size");
    hasher.update(data);
    let mut out = [0u8; DIGEST_BYTES];
    hasher.finalize_variable(&mut out).expect("the buffer has the digest's size");
    out
}

/// One event's key digest from its values at the key's paths (`row`, the sender's
/// last), `data` a buffer for the material; None: the event has no key.
pub fn event_key(spec: &Spec, row: &[&Val], data: &mut Vec<u8>) -> Option<[u8; DIGEST_BYTES]> {
    material(spec, row, data).then(|| digest(data))
}

/// A key's sender: `agent.id`'s text, else empty.
pub fn sender<'v>(v: &'v Val<'_>) -> &'v [u8] {
    text(v).unwrap_or(b"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blake2b_of_the_rfc() {
        // RFC 7693 appendix A gives BLAKE2b-512("abc"); 16-byte digests are checked
        // against hashlib in tests/unit/test_native_keys.py.
        let mut hasher = Blake2bVar::new(64).unwrap();
        hasher.update(b"abc");
        let mut out = [0u8; 64];
        hasher.finalize_variable(&mut out).unwrap();
        assert_eq!(&out[..4], &[0xba, 0x80, 0xa5, 0x3f]);
    }

    #[test]
    fn msgpack_heads() {
        let mut o = Vec::new();
        for (i, want) in [(0i64, vec![0u8]), (127, vec![0x7f]), (128, vec![0xcc, 0x80]), (-1, vec![0xff]), (-33, vec![0xd0, 0xdf])] {
            o.clear();
            int_value(&mut o, i);
            assert_eq!(o, want);
        }
    }
}
