//! logjam request bodies (one JSON object per ZeroMQ message) read without Python objects.
//!
//! `scan` reads a batch of bodies as `jsondoc` reads Beats documents, with the same
//! strict reader (`jsonparse`) and subset, and makes of each the event the `logjam`
//! source makes (`logrouter.sources.logjam_native`, the reference): the body's members,
//! then the message's metadata fields (`<prefix>app`, `env`, `topic`, `device`,
//! `sequence`), timed by the first of the source's `time_fields` that gives a time (an
//! integer or float is milliseconds since the epoch, a string RFC 3339 as
//! `jsondoc::stamp_time` reads it), else the message's fallback (its meta's
//! `created_ms`, else the arrival time), as `events.time_from_fields` does. The records
//! go into a PackedForward-style entries blob, with the JSON text of their top-level
//! objects and arrays (`jsondoc::Spliced`), which `columns::run` reads as it reads a
//! Beats read's.
//!
//! Besides `jsondoc`'s subset, a whole batch is outside where a body holds a key of the
//! metadata fields itself (Python replaces the value where the key stands; rare, and
//! not worth a second writer), where a time-field string is one `stamp_time` leaves to
//! Python, or where an event's time is one EventTime cannot hold.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::jsondoc::{index_words, stamp_event_time, stamp_time, Spliced};
use crate::jsonparse::{write_str, Top, Val, P};
use crate::reader::{count_hour, Outside, R, NANOS_PER_SECOND};

/// One message's part of its event besides the body.
pub struct Meta<'a> {
    pub app: &'a [u8],
    pub env: &'a [u8],
    pub topic: &'a [u8],
    pub device: u32,
    pub sequence: u64,
    /// The time when no time field gives one (ns): created_ms, else the arrival time.
    pub fallback: i64,
}

pub struct Scanned {
    pub blob: Vec<u8>,
    pub texts: Vec<u8>,
    pub index: Vec<Spliced>,
    pub buckets: Vec<(i64, usize)>,
}

/// 2^63 as f64: the first float past int64.
const TWO_63: f64 = 9_223_372_036_854_775_808.0;

/// The event time by `events.time_from_fields`: the first of `names` among the body's
/// members whose value gives a time inside int64 ns, else `fallback`.
fn body_time(top: &Top, names: &[&[u8]], fallback: i64) -> R<i64> {
    for name in names {
        let Some((_, _, _, value)) = top.members.iter().find(|(k, ..)| &**k == *name) else {
            continue;
        };
        let t = match value {
            // Python: int(value * 1_000_000), kept only inside int64.
            Val::Int(i) => i.checked_mul(1_000_000),
            Val::Float(f) => {
                let p = (f * 1_000_000.0).trunc();
                if p.is_finite() && (-TWO_63..TWO_63).contains(&p) {
                    Some(p as i64)
                } else {
                    None
                }
            }
            Val::Str(s) => stamp_time(s)?,
            Val::Owned(s) => stamp_time(s)?,
            // null, a boolean, an object or an array: the next name
            _ => None,
        };
        if let Some(t) = t {
            return Ok(t);
        }
    }
    Ok(fallback)
}

fn write_int(o: &mut Vec<u8>, v: u64) {
    if v > i64::MAX as u64 {
        o.push(0xcf);
    } else {
        o.push(0xd3);
    }
    o.extend_from_slice(&v.to_be_bytes());
}

/// One body: its event into `out`; the event's time.
fn body(doc: &[u8], meta: &Meta, keys: &[Vec<u8>], names: &[&[u8]], out: &mut Scanned, scratch: &mut Vec<u8>) -> R<i64> {
    let blob = &mut out.blob;
    let mut p = P::new(doc)?;
    p.skip_ws();
    p.expect(b'{')?;
    let head = blob.len();
    blob.extend_from_slice(&[0x92, 0xd7, 0x00, 0, 0, 0, 0, 0, 0, 0, 0]);
    let map = blob.len(); // `object` writes a map32 head here, its count patched at its end
    let mut top = Top { drop_metadata: false, members: Vec::new(), containers: Vec::new() };
    p.object(&mut Some(blob), scratch, 1, Some(&mut top))?;
    p.skip_ws();
    if p.i != doc.len() {
        return Err(Outside);
    }
    if !keys.is_empty() {
        if top.members.iter().any(|(k, ..)| keys.iter().any(|key| **k == key[..])) {
            return Err(Outside);
        }
        let count = u32::from_be_bytes(blob[map + 1..map + 5].try_into().map_err(|_| Outside)?);
        blob[map + 1..map + 5].copy_from_slice(&(count + keys.len() as u32).to_be_bytes());
        for (key, text) in keys[..3].iter().zip([meta.app, meta.env, meta.topic]) {
            write_str(blob, key);
            write_str(blob, text);
        }
        write_str(blob, &keys[3]);
        write_int(blob, meta.device as u64);
        write_str(blob, &keys[4]);
        write_int(blob, meta.sequence);
    }
    let time = body_time(&top, names, meta.fallback)?;
    stamp_event_time(&mut blob[head..], time)?;
    for &(at, start, end) in &top.containers {
        let from = out.texts.len();
        out.texts.extend_from_slice(&doc[start..end]);
        let offset = |n: usize| u32::try_from(n).map_err(|_| Outside); // a batch of 4 GiB: Python's
        out.index.push(Spliced { at: offset(at)?, start: offset(from)?, end: offset(out.texts.len())? });
    }
    Ok(time)
}

/// Scan every body with its message's meta (see the module's docs). `keys` are the five
/// metadata field names (none: no metadata fields), `names` the time fields.
pub fn scan(bodies: &[&[u8]], metas: &[Meta], keys: &[Vec<u8>], names: &[&[u8]]) -> R<Scanned> {
    if bodies.len() != metas.len() || !(keys.is_empty() || keys.len() == 5) {
        return Err(Outside);
    }
    let total: usize = bodies.iter().map(|d| d.len()).sum();
    let mut out = Scanned {
        blob: Vec::with_capacity(total + bodies.len() * 96),
        texts: Vec::with_capacity(total),
        index: Vec::new(),
        buckets: Vec::new(),
    };
    let mut scratch = Vec::new();
    for (doc, meta) in bodies.iter().zip(metas) {
        let time = body(doc, meta, keys, names, &mut out, &mut scratch)?;
        count_hour(&mut out.buckets, time)?;
    }
    Ok(out)
}

type PyMeta = (String, String, String, u32, u64, i64);

/// The `Meta` of each message's `(app, env, topic, device, sequence, fallback ns)`.
fn metas_of(infos: &[PyMeta]) -> Vec<Meta<'_>> {
    infos
        .iter()
        .map(|(app, env, topic, device, sequence, fallback)| Meta {
            app: app.as_bytes(),
            env: env.as_bytes(),
            topic: topic.as_bytes(),
            device: *device,
            sequence: *sequence,
            fallback: *fallback,
        })
        .collect()
}

/// `scan_logjam(bodies, metas, prefix, time_fields)`: None if any body is outside the
/// subset (see `logjam`); else `(entries, buckets, texts)` as `scan_documents` gives
/// them, of the events the `logjam` source makes of the bodies (bytes, decompressed)
/// and their messages' `metas` (`(app, env, topic, device, sequence, fallback ns)`),
/// with the metadata fields named `prefix` + `app` … (none for an empty `prefix`).
#[pyfunction]
pub fn scan_logjam<'py>(
    py: Python<'py>,
    bodies: Vec<Bound<'py, PyBytes>>,
    metas: Vec<PyMeta>,
    prefix: String,
    time_fields: Vec<String>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let docs: Vec<&[u8]> = bodies.iter().map(|b| b.as_bytes()).collect();
    let metas = metas_of(&metas);
    let keys = metadata_keys(&prefix);
    let names: Vec<&[u8]> = time_fields.iter().map(|n| n.as_bytes()).collect();
    let found = match crate::guarded(py, || scan(&docs, &metas, &keys, &names))? {
        Ok(found) => found,
        Err(_) => return Ok(None),
    };
    Ok(Some(batch_tuple(py, found)?))
}

/// `(entries, buckets, (index, texts))` of a batch, as `scan_documents` gives them.
fn batch_tuple(py: Python<'_>, found: Scanned) -> PyResult<Bound<'_, PyTuple>> {
    let index = index_words(&found.index);
    let texts = (PyBytes::new(py, crate::bytes_of(&index)), PyBytes::new(py, &found.texts));
    (PyBytes::new(py, &found.blob), found.buckets, texts).into_pyobject(py)
}

fn metadata_keys(prefix: &str) -> Vec<Vec<u8>> {
    if prefix.is_empty() {
        return Vec::new();
    }
    ["app", "env", "topic", "device", "sequence"].iter().map(|n| format!("{prefix}{n}").into_bytes()).collect()
}

/// `LogjamReader(prefix, time_fields)`: a source's reads of bodies for its receiver
/// thread (the names made once, not per body).
#[pyclass(frozen, module = "logrouter_native")]
pub struct LogjamReader {
    keys: Vec<Vec<u8>>,
    names: Vec<Vec<u8>>,
}

/// One body's piece: `(entry, index, texts)`, as `join_logjam` takes it.
type Piece<'py> = (Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>);

fn piece<'py>(py: Python<'py>, found: &Scanned) -> Piece<'py> {
    let index = index_words(&found.index);
    (PyBytes::new(py, &found.blob), PyBytes::new(py, crate::bytes_of(&index)), PyBytes::new(py, &found.texts))
}

#[pymethods]
impl LogjamReader {
    #[new]
    fn new(prefix: &str, time_fields: Vec<String>) -> Self {
        LogjamReader { keys: metadata_keys(prefix), names: time_fields.into_iter().map(String::into_bytes).collect() }
    }

    /// `read(body, app, env, topic, device, sequence, fallback)`: `scan_logjam` of one
    /// body: None if it is outside; else `(entry, index, texts)`, its event's entry and
    /// its top-level containers' text, the index's offsets relative to the two, as
    /// `join_logjam` takes them. The GIL is held: one small body takes less time than
    /// handing the GIL to another thread and waiting to get it back.
    #[allow(clippy::too_many_arguments)]
    fn read<'py>(
        &self,
        py: Python<'py>,
        body: &Bound<'py, PyBytes>,
        app: &str,
        env: &str,
        topic: &str,
        device: u32,
        sequence: u64,
        fallback: i64,
    ) -> PyResult<Option<Piece<'py>>> {
        let meta = Meta { app: app.as_bytes(), env: env.as_bytes(), topic: topic.as_bytes(), device, sequence, fallback };
        let names: Vec<&[u8]> = self.names.iter().map(|n| &n[..]).collect();
        let doc = body.as_bytes();
        let found = crate::caught(|| scan(&[doc], std::slice::from_ref(&meta), &self.keys, &names))?;
        Ok(found.ok().map(|found| piece(py, &found)))
    }

    /// `read_many(bodies, infos)`: `read` of each body with its message's info
    /// (`(app, env, topic, device, sequence, fallback ns)`), in one call that releases
    /// the GIL once for them all (a receiver thread's chunk): a list of pieces, None
    /// where a body is outside.
    fn read_many<'py>(&self, py: Python<'py>, bodies: Vec<Bound<'py, PyBytes>>, infos: Vec<PyMeta>) -> PyResult<Vec<Option<Piece<'py>>>> {
        if bodies.len() != infos.len() {
            return Err(PyValueError::new_err("read_many: as many infos as bodies"));
        }
        let docs: Vec<&[u8]> = bodies.iter().map(|b| b.as_bytes()).collect();
        let metas = metas_of(&infos);
        let names: Vec<&[u8]> = self.names.iter().map(|n| &n[..]).collect();
        let keys = &self.keys;
        let found: Vec<R<Scanned>> = crate::guarded(py, || {
            docs.iter().zip(&metas).map(|(doc, meta)| scan(&[*doc], std::slice::from_ref(meta), keys, &names)).collect()
        })?;
        Ok(found.iter().map(|f| f.as_ref().ok().map(|found| piece(py, found))).collect())
    }
}

/// The entries of `pieces` (`LogjamReader::read`'s) one after another, as `scan` gives a
/// batch of them: each entry's time read back from its EventTime head.
pub fn join(pieces: &[(&[u8], &[u8], &[u8])]) -> R<Scanned> {
    let mut out = Scanned {
        blob: Vec::with_capacity(pieces.iter().map(|p| p.0.len()).sum()),
        texts: Vec::with_capacity(pieces.iter().map(|p| p.2.len()).sum()),
        index: Vec::new(),
        buckets: Vec::new(),
    };
    for (entry, index, texts) in pieces {
        if entry.len() < 11 || entry[..3] != [0x92, 0xd7, 0x00] || index.len() % 12 != 0 {
            return Err(Outside);
        }
        let seconds = u32::from_be_bytes(entry[3..7].try_into().map_err(|_| Outside)?) as i64;
        let nanos = u32::from_be_bytes(entry[7..11].try_into().map_err(|_| Outside)?) as i64;
        count_hour(&mut out.buckets, seconds * NANOS_PER_SECOND + nanos)?;
        let offset = |n: usize| u32::try_from(n).map_err(|_| Outside);
        let (at, from) = (offset(out.blob.len())?, offset(out.texts.len())?);
        for triple in index.chunks_exact(12) {
            let word = |i: usize| u32::from_ne_bytes(triple[i..i + 4].try_into().unwrap_or([0; 4]));
            let (a, s, e) = (word(0), word(4), word(8));
            if a as usize >= entry.len() || s > e || e as usize > texts.len() {
                return Err(Outside);
            }
            out.index.push(Spliced {
                at: at.checked_add(a).ok_or(Outside)?,
                start: from.checked_add(s).ok_or(Outside)?,
                end: from.checked_add(e).ok_or(Outside)?,
            });
        }
        out.blob.extend_from_slice(entry);
        out.texts.extend_from_slice(texts);
    }
    Ok(out)
}

/// A join of fewer bytes than this holds the GIL.
const JOIN_UNLOCKED_BYTES: usize = 1 << 20;

/// `join_logjam(pieces)`: the `(entries, buckets, texts)` of a batch of messages from
/// their `LogjamReader.read` pieces, as `scan_logjam` gives them for the batch's bodies;
/// None for a piece that is not one.
#[pyfunction]
pub fn join_logjam<'py>(
    py: Python<'py>,
    pieces: Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>)>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let parts: Vec<(&[u8], &[u8], &[u8])> = pieces.iter().map(|(e, i, t)| (e.as_bytes(), i.as_bytes(), t.as_bytes())).collect();
    // A join is a copy: below a MiB it takes less time than the GIL's round trip to
    // another thread (the reactor's receiver thread waits for it) and back.
    let size: usize = parts.iter().map(|(e, i, t)| e.len() + i.len() + t.len()).sum();
    let joined = if size < JOIN_UNLOCKED_BYTES { crate::caught(|| join(&parts))? } else { crate::guarded(py, || join(&parts))? };
    let found = match joined {
        Ok(found) => found,
        Err(_) => return Ok(None),
    };
    Ok(Some(batch_tuple(py, found)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::hour_bucket;

    fn meta(fallback: i64) -> Meta<'static> {
        Meta { app: b"shop", env: b"prod", topic: b"logs", device: 7, sequence: u64::MAX, fallback }
    }

    fn keys() -> Vec<Vec<u8>> {
        ["app", "env", "topic", "device", "sequence"].iter().map(|n| format!("logjam_{n}").into_bytes()).collect()
    }

    #[test]
    fn times_by_the_first_field_that_gives_one() {
        let names: Vec<&[u8]> = vec![b"started_ms", b"started_at"];
        let at = |doc: &[u8]| scan(&[doc], &[meta(5 * NANOS_PER_SECOND)], &keys(), &names).map(|s| s.buckets.len());
        assert_eq!(at(br#"{"started_ms":1700000000123,"x":[1]}"#), Ok(1));
        let s = scan(&[br#"{"started_ms":null,"started_at":"2024-01-02T03:04:05Z"}"#], &[meta(1)], &keys(), &names).unwrap();
        assert_eq!(s.buckets, vec![(hour_bucket(1_704_164_645_000_000_000), 1)]);
        let s = scan(&[br#"{"started_ms":true,"started_at":{}}"#], &[meta(5 * NANOS_PER_SECOND)], &keys(), &names).unwrap();
        assert_eq!(s.buckets, vec![(0, 1)]);
        assert_eq!(at(br#"{"started_at":"2024-01-02T03:04:05+01:00"}"#), Err(Outside)); // fromisoformat's
        assert_eq!(at(br#"{"started_ms":-5}"#), Err(Outside)); // before EventTime's range
        assert_eq!(at(br#"{"logjam_app":"x"}"#), Err(Outside));
        assert_eq!(at(br#"{"a":1,"a":2}"#), Err(Outside));
        assert_eq!(at(br#"[1]"#), Err(Outside));
    }

    #[test]
    fn metadata_follows_the_body() {
        let s = scan(&[br#"{"a":{"b":1}}"#], &[meta(5 * NANOS_PER_SECOND)], &keys(), &[]).unwrap();
        let blob = &s.blob;
        assert_eq!(&blob[..3], &[0x92, 0xd7, 0x00]);
        assert_eq!(&blob[11..16], &[0xdf, 0, 0, 0, 6]);
        assert_eq!(s.index.len(), 1);
        assert!(blob.ends_with(&[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]));
        let plain = scan(&[br#"{}"#], &[meta(5 * NANOS_PER_SECOND)], &[], &[]).unwrap();
        assert_eq!(&plain.blob[11..], &[0xdf, 0, 0, 0, 0]);
    }

    #[test]
    fn joined_pieces_are_the_batch_scanned_whole() {
        let docs: Vec<&[u8]> = vec![br#"{"a":[1,{"b":2}],"c":"d"}"#, br#"{}"#, br#"{"x":{},"started_ms":7200000}"#];
        let metas: Vec<Meta> = (0..3).map(|i| meta((i + 1) * 3_600 * NANOS_PER_SECOND)).collect();
        let names: Vec<&[u8]> = vec![b"started_ms"];
        let whole = scan(&docs, &metas, &keys(), &names).unwrap();
        let ones: Vec<Scanned> = docs.iter().zip(&metas).map(|(d, m)| scan(&[d], std::slice::from_ref(m), &keys(), &names).unwrap()).collect();
        let indexes: Vec<Vec<u8>> = ones.iter().map(|o| index_words(&o.index).into_iter().flat_map(u32::to_ne_bytes).collect()).collect();
        let pieces: Vec<(&[u8], &[u8], &[u8])> = ones.iter().zip(&indexes).map(|(o, i)| (&o.blob[..], &i[..], &o.texts[..])).collect();
        let joined = join(&pieces).unwrap();
        assert_eq!((joined.blob, joined.texts, joined.index, joined.buckets), (whole.blob, whole.texts, whole.index, whole.buckets));
        assert_eq!(join(&[(&[0x92, 0xd7, 0x00][..], &[][..], &[][..])]).err(), Some(Outside));
    }
}
