//! A strict JSON reader for `jsondoc`: one document's values checked against the
//! subset the native path takes, optionally written as msgpack on the way.
//!
//! What it refuses (`Outside`): anything but RFC 8259 JSON with whitespace `\x20\t\n\r`;
//! strings that are not valid UTF-8, hold a raw control character or a lone surrogate
//! escape (Python keeps one, UTF-8 cannot); a key twice in one object (Python's dict
//! keeps the last); integers beyond int64; floats that overflow to infinity (Python's
//! `json` reads them so, msgspec refuses them); nesting deeper than `MAX_DEPTH`. Every
//! read is bounds-checked; nothing here panics on any input. Objects and arrays are
//! written with 32-bit counts patched in at their end, strings with their shortest
//! header, integers as int64 and floats as float64: msgpack any reader takes.

use crate::reader::{Outside, R, MAX_DEPTH};

pub const METADATA: &[u8] = b"@metadata";

/// A looked-up field's value, for the source's tags and idempotency keys.
#[derive(Debug, Clone, PartialEq)]
pub enum Val<'a> {
    Missing, // missing or null: Python's None
    Bool(bool),
    Int(i64),
    Float(f64),
    /// A string: raw bytes of the document, or `Owned` when it had escapes.
    Str(&'a [u8]),
    Owned(Vec<u8>),
    Container,
}

/// A reader over one document, which must be valid UTF-8 (`P::new` checks it): a
/// string's bytes between two quotes are then valid UTF-8 too, with no check per string.
pub struct P<'a> {
    pub s: &'a [u8],
    pub i: usize,
    /// The keys of the objects being read, outermost first (one allocation per reader),
    /// and a fingerprint of each (`fingerprint`): most keys differ there already.
    keys: Vec<std::borrow::Cow<'a, [u8]>>,
    prints: Vec<u64>,
}

/// A key's length and first bytes in one word: equal keys have equal ones.
#[inline]
fn fingerprint(key: &[u8]) -> u64 {
    let mut head = [0u8; 8];
    let n = key.len().min(8);
    head[..n].copy_from_slice(&key[..n]);
    u64::from_le_bytes(head) ^ ((key.len() as u64) << 56)
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Whether any of the 8 bytes of `v` may be a quote, a backslash or a control character
/// (a false alarm is allowed: the caller then looks byte by byte).
#[inline]
fn maybe_special(v: u64) -> bool {
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    (zero(v ^ (ONES * b'"' as u64)) | zero(v ^ (ONES * b'\\' as u64)) | (v.wrapping_sub(ONES * 0x20) & !v & HIGH)) != 0
}

/// Whether any of the 8 bytes of `v` may be a quote or a backslash (false alarms allowed).
#[inline]
fn quote_or_backslash(v: u64) -> bool {
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    (zero(v ^ (ONES * b'"' as u64)) | zero(v ^ (ONES * b'\\' as u64))) != 0
}

#[inline]
fn ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl<'a> P<'a> {
    /// A reader at the start of `doc`, if it is valid UTF-8 (std's check, fast on ASCII).
    pub fn new(doc: &'a [u8]) -> R<Self> {
        std::str::from_utf8(doc).map_err(|_| Outside)?;
        Ok(P { s: doc, i: 0, keys: Vec::new(), prints: Vec::new() })
    }

    /// This reader at the start of another document (`new`'s check), its buffers kept.
    pub fn restart(&mut self, doc: &'a [u8]) -> R<()> {
        std::str::from_utf8(doc).map_err(|_| Outside)?;
        self.s = doc;
        self.i = 0;
        self.keys.clear();
        self.prints.clear();
        Ok(())
    }

    /// A reader at `i` of a document that passed `new`.
    pub fn at(doc: &'a [u8], i: usize) -> Self {
        P { s: doc, i, keys: Vec::new(), prints: Vec::new() }
    }

    #[inline]
    pub fn skip_ws(&mut self) {
        while self.i < self.s.len() && ws(self.s[self.i]) {
            self.i += 1;
        }
    }

    #[inline]
    pub fn peek(&self) -> R<u8> {
        self.s.get(self.i).copied().ok_or(Outside)
    }

    #[inline]
    pub fn expect(&mut self, b: u8) -> R<()> {
        if self.peek()? != b {
            return Err(Outside);
        }
        self.i += 1;
        Ok(())
    }

    /// Past a string's closing quote, from after its opening one, in a document read
    /// whole once already (no checks but bounds).
    fn skip_string(&mut self) -> R<()> {
        let s = self.s;
        let mut j = self.i;
        loop {
            // Eight bytes at a time up to the next quote or backslash.
            while let Some(chunk) = s.get(j..j + 8) {
                if quote_or_backslash(u64::from_le_bytes(chunk.try_into().map_err(|_| Outside)?)) {
                    break;
                }
                j += 8;
            }
            match s.get(j) {
                None => return Err(Outside),
                Some(b'"') => {
                    self.i = j + 1;
                    return Ok(());
                }
                Some(b'\\') => j += 2,
                Some(_) => j += 1,
            }
        }
    }

    /// Past one value, in a document read whole once already: what `lookup` does with
    /// the members it does not want (no checks but bounds, no output).
    pub fn skip_value(&mut self) -> R<()> {
        match self.peek()? {
            b'"' => {
                self.i += 1;
                self.skip_string()
            }
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'"' => {
                            self.i += 1;
                            self.skip_string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                return Ok(());
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
            }
            _ => {
                while self.i < self.s.len() && !matches!(self.s[self.i], b',' | b'}' | b']') && !ws(self.s[self.i]) {
                    self.i += 1;
                }
                Ok(())
            }
        }
    }

    fn hex4(&mut self) -> R<u32> {
        let h = self.s.get(self.i..self.i + 4).ok_or(Outside)?;
        let mut v = 0u32;
        for &c in h {
            v = v * 16 + (c as char).to_digit(16).ok_or(Outside)?;
        }
        self.i += 4;
        Ok(v)
    }

    /// A string after its `"`: its decoded bytes into `out` (cleared first) when it has
    /// escapes; returns the raw span when it has none (`out` then untouched).
    pub fn string(&mut self, out: &mut Vec<u8>) -> R<Option<&'a [u8]>> {
        let start = self.i;
        let s = self.s;
        // The common case: no escape, ASCII or plain UTF-8.
        let mut j = start;
        while let Some(chunk) = s.get(j..j + 8) {
            if maybe_special(u64::from_le_bytes(chunk.try_into().map_err(|_| Outside)?)) {
                break;
            }
            j += 8;
        }
        while j < s.len() {
            let b = s[j];
            if b == b'"' {
                self.i = j + 1;
                return Ok(Some(&s[start..j])); // valid UTF-8: see `P`
            }
            if b == b'\\' {
                break;
            }
            if b < 0x20 {
                return Err(Outside);
            }
            j += 1;
        }
        if j >= s.len() {
            return Err(Outside);
        }
        out.clear();
        out.extend_from_slice(&s[start..j]);
        self.i = j;
        loop {
            let b = self.peek()?;
            match b {
                b'"' => {
                    self.i += 1;
                    return Ok(None);
                }
                b'\\' => {
                    self.i += 1;
                    let e = self.peek()?;
                    self.i += 1;
                    let c = match e {
                        b'"' => b'"',
                        b'\\' => b'\\',
                        b'/' => b'/',
                        b'b' => 0x08,
                        b'f' => 0x0c,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'u' => {
                            let mut cp = self.hex4()?;
                            if (0xd800..0xdc00).contains(&cp) {
                                if self.s.get(self.i..self.i + 2) != Some(b"\\u") {
                                    return Err(Outside); // a lone surrogate: Python keeps it, UTF-8 cannot
                                }
                                self.i += 2;
                                let low = self.hex4()?;
                                if !(0xdc00..0xe000).contains(&low) {
                                    return Err(Outside);
                                }
                                cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
                            } else if (0xdc00..0xe000).contains(&cp) {
                                return Err(Outside);
                            }
                            let ch = char::from_u32(cp).ok_or(Outside)?;
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                            continue;
                        }
                        _ => return Err(Outside),
                    };
                    out.push(c);
                }
                0x00..=0x1f => return Err(Outside),
                _ => {
                    // A run of plain bytes up to the next quote or backslash.
                    let from = self.i;
                    let mut k = from;
                    while k < self.s.len() && !matches!(self.s[k], b'"' | b'\\' | 0x00..=0x1f) {
                        k += 1;
                    }
                    out.extend_from_slice(&self.s[from..k]);
                    self.i = k;
                }
            }
        }
    }

    /// A number: Int inside int64 or a finite Float, by JSON's strict grammar.
    fn number(&mut self) -> R<Val<'a>> {
        let start = self.i;
        let s = self.s;
        let mut j = start;
        if s.get(j) == Some(&b'-') {
            j += 1;
        }
        match s.get(j) {
            Some(b'0') => j += 1,
            Some(b'1'..=b'9') => {
                while matches!(s.get(j), Some(b'0'..=b'9')) {
                    j += 1;
                }
            }
            _ => return Err(Outside),
        }
        let mut float = false;
        if s.get(j) == Some(&b'.') {
            float = true;
            j += 1;
            if !matches!(s.get(j), Some(b'0'..=b'9')) {
                return Err(Outside);
            }
            while matches!(s.get(j), Some(b'0'..=b'9')) {
                j += 1;
            }
        }
        if matches!(s.get(j), Some(b'e' | b'E')) {
            float = true;
            j += 1;
            if matches!(s.get(j), Some(b'+' | b'-')) {
                j += 1;
            }
            if !matches!(s.get(j), Some(b'0'..=b'9')) {
                return Err(Outside);
            }
            while matches!(s.get(j), Some(b'0'..=b'9')) {
                j += 1;
            }
        }
        self.i = j;
        let text = std::str::from_utf8(&s[start..j]).map_err(|_| Outside)?;
        if float {
            let v: f64 = text.parse().map_err(|_| Outside)?;
            if !v.is_finite() {
                return Err(Outside); // Python's json reads 1e400 as inf, msgspec refuses it
            }
            Ok(Val::Float(v))
        } else {
            Ok(Val::Int(text.parse::<i64>().map_err(|_| Outside)?)) // beyond int64: Python's path
        }
    }

    fn literal(&mut self, word: &[u8]) -> R<()> {
        if self.s.get(self.i..self.i + word.len()) != Some(word) {
            return Err(Outside);
        }
        self.i += word.len();
        Ok(())
    }

    /// One value (whitespace before it skipped), written as msgpack to `out` when given;
    /// `depth` is the nesting of the container holding it.
    pub fn value(&mut self, out: &mut Option<&mut Vec<u8>>, scratch: &mut Vec<u8>, depth: usize) -> R<Val<'a>> {
        self.skip_ws();
        let b = self.peek()?;
        let v = match b {
            b'{' => {
                if depth >= MAX_DEPTH {
                    return Err(Outside);
                }
                self.i += 1;
                self.object(out, scratch, depth + 1, None)?;
                return Ok(Val::Container);
            }
            b'[' => {
                if depth >= MAX_DEPTH {
                    return Err(Outside);
                }
                self.i += 1;
                let at = out.as_mut().map(|o| {
                    o.extend_from_slice(&[0xdd, 0, 0, 0, 0]);
                    o.len() - 4
                });
                let mut n: u32 = 0;
                self.skip_ws();
                if self.peek()? == b']' {
                    self.i += 1;
                } else {
                    loop {
                        self.value(out, scratch, depth + 1)?;
                        n += 1;
                        self.skip_ws();
                        match self.peek()? {
                            b',' => self.i += 1,
                            b']' => {
                                self.i += 1;
                                break;
                            }
                            _ => return Err(Outside),
                        }
                    }
                }
                if let (Some(o), Some(at)) = (out.as_mut(), at) {
                    o[at..at + 4].copy_from_slice(&n.to_be_bytes());
                }
                return Ok(Val::Container);
            }
            b'"' => {
                self.i += 1;
                match self.string(scratch)? {
                    Some(raw) => Val::Str(raw),
                    None => Val::Owned(scratch.clone()),
                }
            }
            b't' => {
                self.literal(b"true")?;
                Val::Bool(true)
            }
            b'f' => {
                self.literal(b"false")?;
                Val::Bool(false)
            }
            b'n' => {
                self.literal(b"null")?;
                Val::Missing
            }
            _ => self.number()?,
        };
        if let Some(o) = out.as_mut() {
            write_scalar(o, &v);
        }
        Ok(v)
    }

    /// An object's members after its `{`. Keys are checked unique (decoded). With
    /// `top`, each member's decoded key and value span is recorded, and `@metadata` is
    /// left out of `out` when `top.drop_metadata`.
    pub fn object(&mut self, out: &mut Option<&mut Vec<u8>>, scratch: &mut Vec<u8>, depth: usize, mut top: Option<&mut Top<'a>>) -> R<()> {
        let at = out.as_mut().map(|o| {
            o.extend_from_slice(&[0xdf, 0, 0, 0, 0]);
            o.len() - 4
        });
        let mut n: u32 = 0;
        let base = self.keys.len();
        let mut many: Option<std::collections::HashSet<std::borrow::Cow<'a, [u8]>>> = None;
        self.skip_ws();
        if self.peek()? == b'}' {
            self.i += 1;
        } else {
            loop {
                self.skip_ws();
                self.expect(b'"')?;
                let key: std::borrow::Cow<'a, [u8]> = match self.string(scratch)? {
                    Some(raw) => raw.into(),
                    None => scratch.clone().into(),
                };
                // A key twice: Python's dict keeps the last, the Python path decides.
                match many.as_mut() {
                    Some(set) => {
                        if !set.insert(key.clone()) {
                            return Err(Outside);
                        }
                    }
                    None => {
                        let keys = &self.keys[base..];
                        let print = fingerprint(&key);
                        if self.prints[base..].iter().zip(keys).any(|(&p, k)| p == print && *k == key) {
                            return Err(Outside);
                        }
                        if keys.len() >= 16 {
                            let mut set: std::collections::HashSet<_> = keys.iter().cloned().collect();
                            set.insert(key.clone());
                            many = Some(set);
                        }
                    }
                }
                self.skip_ws();
                self.expect(b':')?;
                let drop = top.as_ref().map_or(false, |t| t.drop_metadata && &*key == METADATA);
                let mut member_out: Option<&mut Vec<u8>> = if drop { None } else { out.as_deref_mut() };
                if let Some(o) = member_out.as_mut() {
                    write_str(o, &key);
                    n += 1;
                }
                self.skip_ws();
                let start = self.i;
                let at = member_out.as_ref().map(|o| o.len());
                let v = self.value(&mut member_out, scratch, depth)?;
                if let Some(t) = top.as_mut() {
                    if let (Val::Container, Some(at)) = (&v, at) {
                        t.containers.push((at, start, self.i));
                    }
                    t.members.push((key.clone(), start, self.i, v));
                }
                if many.is_none() {
                    self.prints.push(fingerprint(&key));
                    self.keys.push(key);
                }
                self.skip_ws();
                match self.peek()? {
                    b',' => self.i += 1,
                    b'}' => {
                        self.i += 1;
                        break;
                    }
                    _ => return Err(Outside),
                }
            }
        }
        self.keys.truncate(base);
        self.prints.truncate(base);
        if let (Some(o), Some(at)) = (out.as_mut(), at) {
            o[at..at + 4].copy_from_slice(&n.to_be_bytes());
        }
        Ok(())
    }
}

/// A top-level object's members: decoded key, value span, and the value when scalar.
pub struct Top<'a> {
    pub drop_metadata: bool,
    pub members: Vec<(std::borrow::Cow<'a, [u8]>, usize, usize, Val<'a>)>,
    /// The members that are objects or arrays and were written to `out`: where their
    /// msgpack starts in `out`, and their JSON text's span in the document.
    pub containers: Vec<(usize, usize, usize)>,
}

pub fn write_str(o: &mut Vec<u8>, s: &[u8]) {
    let n = s.len();
    if n < 32 {
        // Most keys and values: header and text in one go, without a call to memcpy
        // for a few bytes (two overlapping word copies).
        o.reserve(1 + n);
        let at = o.len();
        // SAFETY: `reserve` made room for 1 + n bytes past `at`; every write below stays
        // inside `at..at + 1 + n` and every read inside `s`.
        unsafe {
            let dst = o.as_mut_ptr().add(at);
            *dst = 0xa0 | n as u8;
            let (src, dst) = (s.as_ptr(), dst.add(1));
            if n >= 16 {
                std::ptr::write_unaligned(dst as *mut u128, std::ptr::read_unaligned(src as *const u128));
                std::ptr::write_unaligned(dst.add(n - 16) as *mut u128, std::ptr::read_unaligned(src.add(n - 16) as *const u128));
            } else if n >= 8 {
                std::ptr::write_unaligned(dst as *mut u64, std::ptr::read_unaligned(src as *const u64));
                std::ptr::write_unaligned(dst.add(n - 8) as *mut u64, std::ptr::read_unaligned(src.add(n - 8) as *const u64));
            } else if n >= 4 {
                std::ptr::write_unaligned(dst as *mut u32, std::ptr::read_unaligned(src as *const u32));
                std::ptr::write_unaligned(dst.add(n - 4) as *mut u32, std::ptr::read_unaligned(src.add(n - 4) as *const u32));
            } else {
                for k in 0..n {
                    *dst.add(k) = *src.add(k);
                }
            }
            o.set_len(at + 1 + n);
        }
        return;
    } else if n < 256 {
        o.extend_from_slice(&[0xd9, n as u8]);
    } else if n < 65536 {
        o.push(0xda);
        o.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        o.push(0xdb);
        o.extend_from_slice(&(n as u32).to_be_bytes());
    }
    o.extend_from_slice(s);
}

fn write_scalar(o: &mut Vec<u8>, v: &Val) {
    match v {
        Val::Missing => o.push(0xc0),
        Val::Bool(b) => o.push(if *b { 0xc3 } else { 0xc2 }),
        Val::Int(i) => {
            o.push(0xd3);
            o.extend_from_slice(&i.to_be_bytes());
        }
        Val::Float(f) => {
            o.push(0xcb);
            o.extend_from_slice(&f.to_bits().to_be_bytes());
        }
        Val::Str(s) => write_str(o, s),
        Val::Owned(s) => write_str(o, s),
        Val::Container => {}
    }
}
