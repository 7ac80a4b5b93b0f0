//! Lumberjack (Beats) `J` frames cut out natively: the run of whole JSON data frames
//! that `logrouter.wire.lumberjack.LumberjackDecoder._json_frames` walks, without a
//! Python bytes object per document.
//!
//! A run is where its documents lie: `(seq, start, stop)` u32 triples (native-endian)
//! over one buffer, the inflated `C` payload (or a copy of the plain frames). The scan
//! (`scan_runs`) reads the documents in place; `split_documents` makes them bytes
//! objects where Python needs them (its decode, the spool record). The walk stops
//! exactly where the Python one does (a frame of another kind or version, one not
//! whole yet, one over the event limit, the frame budget spent); it raises nothing:
//! the decoder's own loop then meets that frame and says what is wrong with it.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

/// Where a run of `J` frames stopped, the highest seq met (`top` included), and per
/// document `(seq, start, stop)` counted from `base`. None where an offset from `base`
/// does not fit in 32 bits (the Python walk takes such a run).
pub fn walk(buf: &[u8], mut pos: usize, end: usize, tag: u16, limit: u64, max_frames: usize, mut top: u32, base: usize) -> Option<(usize, u32, Vec<u32>)> {
    let end = end.min(buf.len());
    let mut spans = Vec::new();
    let mut frames = 0usize;
    while frames < max_frames && end >= pos + 10 {
        let h = &buf[pos..pos + 10];
        if u16::from_be_bytes([h[0], h[1]]) != tag {
            break;
        }
        let seq = u32::from_be_bytes([h[2], h[3], h[4], h[5]]);
        let size = u32::from_be_bytes([h[6], h[7], h[8], h[9]]) as usize;
        let stop = pos + 10 + size;
        if stop > end || size as u64 > limit {
            break; // the decoder waits for it, or refuses it once this run is accounted
        }
        let start = u32::try_from(pos + 10 - base).ok()?;
        spans.extend_from_slice(&[seq, start, u32::try_from(stop - base).ok()?]);
        top = top.max(seq);
        pos = stop;
        frames += 1;
    }
    Some((pos, top, spans))
}

/// The documents of one run, checked against its buffer.
pub fn documents<'a>(buffer: &'a [u8], spans: &[u8]) -> PyResult<Vec<(u32, &'a [u8])>> {
    if spans.len() % 12 != 0 {
        return Err(PyValueError::new_err("spans: u32 triples"));
    }
    spans
        .chunks_exact(12)
        .map(|c| {
            let word = |i: usize| u32::from_ne_bytes([c[i], c[i + 1], c[i + 2], c[i + 3]]);
            let (seq, start, stop) = (word(0), word(4) as usize, word(8) as usize);
            match buffer.get(start..stop) {
                Some(doc) => Ok((seq, doc)),
                None => Err(PyValueError::new_err("spans: outside the buffer")),
            }
        })
        .collect()
}

pub type Run<'py> = (Bound<'py, PyBytes>, Bound<'py, PyBytes>);

/// Every document of `runs`, in order.
pub fn run_documents<'a>(runs: &'a [Run<'_>]) -> PyResult<Vec<(u32, &'a [u8])>> {
    let mut out = Vec::new();
    for (buffer, spans) in runs {
        out.extend(documents(buffer.as_bytes(), spans.as_bytes())?);
    }
    Ok(out)
}

/// `json_frames(buf, pos, end, tag, limit, max_frames, top, base)`: the run of whole
/// `J` frames at `pos` of `buf` (bytes or bytearray, up to `end`) whose first two bytes
/// are `tag` (version byte << 8 | 'J'), at most `max_frames` of them, each document at
/// most `limit` bytes: `(stop, top, spans)`, where the run stopped, the highest seq
/// (`top` and the run's), and per document `(seq, start, stop)` u32 triples counted
/// from `base`; None where those do not fit in 32 bits.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn json_frames<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
    pos: usize,
    end: usize,
    tag: u16,
    limit: u64,
    max_frames: usize,
    top: u32,
    base: usize,
) -> PyResult<Option<(usize, u32, Bound<'py, PyBytes>)>> {
    let view = pyo3::buffer::PyBuffer::<u8>::get(buf)?;
    if !view.is_c_contiguous() || base > pos {
        return Err(PyValueError::new_err("json_frames wants contiguous bytes and base <= pos"));
    }
    // The exporter cannot resize or free the bytes while `view` holds them, and the GIL
    // is held throughout.
    let data = unsafe { std::slice::from_raw_parts(view.buf_ptr() as *const u8, view.len_bytes()) };
    Ok(walk(data, pos, end, tag, limit, max_frames, top, base).map(|(stop, top, spans)| (stop, top, PyBytes::new(py, crate::bytes_of(&spans)))))
}

/// `split_documents(runs)`: `(documents, seqs)` of `runs` (`(buffer, spans)` as
/// `json_frames` gives them): each document a bytes object, and its frame's seq.
#[pyfunction]
pub fn split_documents<'py>(py: Python<'py>, runs: Vec<Run<'py>>) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
    let docs = run_documents(&runs)?;
    let documents = PyList::new(py, docs.iter().map(|(_, d)| PyBytes::new(py, d)))?;
    let seqs = PyList::new(py, docs.iter().map(|(seq, _)| *seq))?;
    Ok((documents, seqs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(version: u8, kind: u8, seq: u32, doc: &[u8]) -> Vec<u8> {
        let mut f = vec![version, kind];
        f.extend_from_slice(&seq.to_be_bytes());
        f.extend_from_slice(&(doc.len() as u32).to_be_bytes());
        f.extend_from_slice(doc);
        f
    }

    #[test]
    fn walks_until_another_frame() {
        let tag = u16::from_be_bytes([b'2', b'J']);
        let mut buf = [frame(b'2', b'J', 7, b"{}"), frame(b'2', b'J', 3, b"{\"a\":1}"), frame(b'2', b'W', 0, b"")].concat();
        let (stop, top, spans) = walk(&buf, 0, buf.len(), tag, 100, usize::MAX, 0, 0).unwrap();
        assert_eq!((stop, top), (12 + 17, 7));
        assert_eq!(spans, vec![7, 10, 12, 3, 22, 29]);
        // Budget, limit, a frame not whole yet, base.
        assert_eq!(walk(&buf, 0, buf.len(), tag, 100, 1, 9, 0).unwrap().0, 12);
        assert_eq!(walk(&buf, 0, buf.len(), tag, 6, usize::MAX, 0, 0).unwrap().0, 12);
        assert_eq!(walk(&buf, 0, 28, tag, 100, usize::MAX, 0, 0).unwrap().0, 12);
        assert_eq!(walk(&buf, 12, buf.len(), tag, 100, usize::MAX, 0, 12).unwrap().2, vec![3, 10, 17]);
        buf[0] = b'1';
        assert_eq!(walk(&buf, 0, buf.len(), tag, 100, usize::MAX, 0, 0).unwrap().0, 0);
    }
}
