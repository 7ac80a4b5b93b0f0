//! logrouter's native decoders, a Python extension module (`logrouter_native`).
//!
//! Forward PackedForward entries go from the received bytes straight into the Arrow
//! buffers of a lake row group (`columns`), with the GIL released while they are
//! read. Only the subset `reader` describes is taken; for anything else (and for any
//! malformed input) the functions answer None and logrouter's Python path, the
//! reference, decodes it. No Arrow library is linked: the buffers go to pyarrow as
//! bytes (`pyarrow.Array.from_buffers`). Python keeps the control plane.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString, PyTuple};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub mod beats;
pub mod columns;
pub mod edits;
pub mod forward_frame;
pub mod frame;
pub mod json;
pub mod jsondoc;
pub mod jsonparse;
pub mod logjam;
pub mod keys;
pub mod reader;

/// Run `work` without the GIL; a panic (a bug, never an input's doing) becomes a
/// RuntimeError instead of unwinding into Python.
fn guarded<T: Send>(py: Python<'_>, work: impl FnOnce() -> T + Send) -> PyResult<T> {
    py.detach(|| catch_unwind(AssertUnwindSafe(work)))
        .map_err(|_| PyRuntimeError::new_err("logrouter_native panicked (a bug): the Python path takes over"))
}

/// Run `work` holding the GIL (work too short to be worth a switch of threads); a panic
/// becomes a RuntimeError, as in `guarded`.
fn caught<T>(work: impl FnOnce() -> T) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(work))
        .map_err(|_| PyRuntimeError::new_err("logrouter_native panicked (a bug): the Python path takes over"))
}

pub(crate) fn bytes_of<T: Copy>(values: &[T]) -> &[u8] {
    // Arrow buffers are native-endian: the values' own bytes are what it reads.
    unsafe { std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values)) }
}

/// `scan(blob, now, stop=None)`: None if the entries blob (its first `stop` bytes, if
/// given) is outside the native subset (or malformed); else `(entries, needs_now,
/// [(hour bucket, entries), ...])`, the buckets in order of first appearance. Time-0
/// entries take `now`; with `now` None they only set `needs_now` and are left out of
/// the buckets.
#[pyfunction]
#[pyo3(signature = (blob, now=None, stop=None))]
fn scan(
    py: Python<'_>,
    blob: &Bound<'_, PyBytes>,
    now: Option<i64>,
    stop: Option<usize>,
) -> PyResult<Option<(usize, bool, Vec<(i64, usize)>)>> {
    let data = blob.as_bytes();
    let data = &data[..stop.unwrap_or(data.len()).min(data.len())];
    let found = guarded(py, || reader::scan(data, now))?;
    Ok(found.ok().map(|s| (s.entries, s.needs_now, s.buckets)))
}

/// `frame(blob)`: `(end, tell)` for the start of a stream of entries: where its last
/// complete entry ends (0: none yet) and where msgpack's streaming unpacker would stand
/// after all of it (`frame::frame`); None at a byte msgpack refuses, an entry that is
/// no pair, or deep nesting (the Python path says what it is).
#[pyfunction]
#[pyo3(name = "frame")]
fn frame_entries(py: Python<'_>, blob: &Bound<'_, PyBytes>) -> PyResult<Option<(usize, usize)>> {
    let data = blob.as_bytes();
    let found = guarded(py, || frame::frame(data))?;
    Ok(found.map(|f| (f.end, f.tell)))
}

/// `forward_frames(data, limit)`: the whole PackedForward messages at the start of
/// `data` (bytes or bytearray), as `(start, end, tag_start, tag_end, blob_start,
/// blob_end, options)` with options None or `(start, end)`; the offset where they end;
/// and what then: the length `data` must reach before anything more can be framed, or
/// -1 where the Python framer takes the stream (`forward_frame`).
#[pyfunction]
fn forward_frames(data: &Bound<'_, PyAny>, limit: usize) -> PyResult<(Vec<FramedMessage>, usize, i64)> {
    let view = pyo3::buffer::PyBuffer::<u8>::get(data)?;
    if !view.is_c_contiguous() {
        return Err(PyValueError::new_err("forward_frames wants contiguous bytes"));
    }
    // The exporter cannot resize or free the bytes while `view` holds them, and the GIL
    // is held throughout.
    let buf = unsafe { std::slice::from_raw_parts(view.buf_ptr() as *const u8, view.len_bytes()) };
    let (found, used, stop) = forward_frame::packed_messages(buf, limit);
    let messages = found
        .iter()
        .map(|m| (m.start, m.end, m.tag.0, m.tag.1, m.blob.0, m.blob.1, m.options))
        .collect();
    let next = match stop {
        forward_frame::Stop::Wait(need) => need as i64,
        forward_frame::Stop::Python => -1,
    };
    Ok((messages, used, next))
}

type FramedMessage = (usize, usize, usize, usize, usize, usize, Option<(usize, usize)>);

fn column_tuple<'py>(py: Python<'py>, column: &columns::Column) -> PyResult<Bound<'py, PyTuple>> {
    let validity = if column.nulls > 0 { Some(PyBytes::new(py, &column.validity)) } else { None };
    let offsets = if column.kind == columns::STRING || column.kind == columns::BINARY {
        Some(PyBytes::new(py, bytes_of(&column.offsets)))
    } else {
        None
    };
    (column.nulls, validity, PyBytes::new(py, &column.data), offsets).into_pyobject(py)
}

/// `build(pieces, schema, build=True)`: the rows of `pieces` (`(blob, now, bucket,
/// start, stop)`: an entries blob, the time its time-0 entries take, the one hour
/// bucket to take rows of or None for all, and which of those rows: `start` up to
/// `stop`) as Arrow buffers of `schema` (`(name, type code)`: 1
/// bool, 2 int64, 3 float64, 4 string, 5 binary). None if any piece is outside the
/// native subset. Else `(rows, times, columns, extra, fields)`: the int64 nanosecond
/// times' bytes, per column and for `_extra` `(null_count, validity or None, data,
/// offsets or None)`, and every field met in order of first appearance as `(name,
/// first scalar type code or 0, whether a float followed a first int)`. With
/// `build=False` only `rows`, `times` and `fields` are filled. `filtered`, one per
/// piece where given, is what filters did to its rows (see `filtered`).
///
/// `checked=True` says every piece's blob got a result from `scan` (in this process):
/// its strings, keys and nesting are then not checked again. Never pass it for bytes
/// that were not scanned.
///
/// `texts`, one per piece where given: None, or the `(index, texts)` that
/// `scan_documents` gave with the piece's blob, whose top-level containers' JSON text
/// `_extra` then takes as it came. Never pass it with another blob.
#[pyfunction]
#[pyo3(signature = (pieces, schema, build=true, filtered=None, checked=false, texts=None))]
#[allow(clippy::too_many_arguments)]
fn build<'py>(
    py: Python<'py>,
    pieces: Vec<(Bound<'py, PyBytes>, Option<i64>, Option<i64>, usize, usize)>,
    schema: Vec<(String, u8)>,
    build: bool,
    filtered: Option<Vec<Filtered<'py>>>,
    checked: bool,
    texts: Option<Vec<Option<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>>>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let (selections, edits) = unpack_filtered(filtered, pieces.len())?;
    let texts = texts.unwrap_or_else(|| pieces.iter().map(|_| None).collect());
    if texts.len() != pieces.len() || texts.iter().flatten().any(|(index, _)| index.as_bytes().len() % 12 != 0) {
        return Err(PyValueError::new_err("texts: one per piece, an index of u32 triples"));
    }
    let parts: Vec<columns::Piece> =
        pieces.iter().enumerate().map(|(i, (blob, now, bucket, start, stop))| columns::Piece {
        blob: blob.as_bytes(),
        now: *now,
        bucket: *bucket,
        start: *start,
        stop: *stop,
        selection: selections[i].as_ref().map(|b| b.as_bytes()),
        edits: &edits[i],
        checked,
        texts: texts[i].as_ref().map(|(index, data)| columns::Texts { index: index.as_bytes(), data: data.as_bytes() }),
    }).collect();
    let names: Vec<(&[u8], u8)> = schema.iter().map(|(name, kind)| (name.as_bytes(), *kind)).collect();
    let out = match guarded(py, || columns::run(&parts, &names, build))? {
        Ok(out) => out,
        Err(_) => return Ok(None),
    };
    let cols = PyList::empty(py);
    for column in &out.columns {
        cols.append(column_tuple(py, column)?)?;
    }
    let fields = PyList::empty(py);
    for &id in &out.order {
        let field = &out.fields[id];
        let name = std::str::from_utf8(field.name).map_err(|_| PyRuntimeError::new_err("field name not UTF-8"))?;
        fields.append((name, field.first, field.float_after_int))?;
    }
    let extra = if build { Some(column_tuple(py, &out.extra)?) } else { None };
    let result = (out.rows, PyBytes::new(py, bytes_of(&out.times)), cols, extra, fields).into_pyobject(py)?;
    Ok(Some(result))
}

/// What filters did to one piece's rows: the selection (the sorted row numbers kept,
/// as native-endian u32 bytes; None: all) and the edits, each `(op, [(key, value)])`
/// with op 1 set (value: the msgpack bytes set), 2 remove (value unused), 3 rename
/// (value: the new name).
type Filtered<'py> = (Option<Bound<'py, PyBytes>>, Vec<(u8, Vec<(Vec<u8>, Vec<u8>)>)>);

fn unpack_filtered<'py>(
    filtered: Option<Vec<Filtered<'py>>>,
    pieces: usize,
) -> PyResult<(Vec<Option<Bound<'py, PyBytes>>>, Vec<Vec<edits::Edit>>)> {
    let Some(filtered) = filtered else {
        return Ok(((0..pieces).map(|_| None).collect(), (0..pieces).map(|_| Vec::new()).collect()));
    };
    if filtered.len() != pieces {
        return Err(PyValueError::new_err("filtered: one per piece"));
    }
    let mut selections = Vec::new();
    let mut all = Vec::new();
    for (selection, ops) in filtered {
        if selection.as_ref().is_some_and(|b| b.as_bytes().len() % 4 != 0) {
            return Err(PyValueError::new_err("selection: u32 row numbers"));
        }
        selections.push(selection);
        let mut list = Vec::new();
        for (op, pairs) in ops {
            list.push(match op {
                1 => edits::Edit::Set(pairs),
                2 => edits::Edit::Remove(pairs.into_iter().map(|(key, _)| key).collect()),
                3 => edits::Edit::Rename(pairs),
                _ => return Err(PyValueError::new_err("edit: op 1, 2 or 3")),
            });
        }
        all.push(list);
    }
    Ok((selections, all))
}

fn rows_of<'a>(
    pieces: &'a [(Bound<'_, PyBytes>, Option<i64>, Option<i64>, usize, usize)],
    selections: &'a [Option<Bound<'_, PyBytes>>],
    edits: &'a [Vec<edits::Edit>],
) -> Vec<edits::Rows<'a>> {
    pieces.iter().enumerate().map(|(i, (blob, now, bucket, start, stop))| edits::Rows {
        blob: blob.as_bytes(),
        now: *now,
        bucket: *bucket,
        start: *start,
        stop: *stop,
        selection: selections[i].as_ref().map(|b| b.as_bytes()),
        edits: &edits[i],
    }).collect()
}

fn strings_tuple<'py>(py: Python<'py>, s: &edits::Strings) -> (usize, Option<Bound<'py, PyBytes>>, Bound<'py, PyBytes>, Bound<'py, PyBytes>) {
    let validity = if s.nulls > 0 { Some(PyBytes::new(py, &s.validity)) } else { None };
    let offsets = if s.offsets.is_empty() { vec![0i32] } else { s.offsets.clone() };
    (s.nulls, validity, PyBytes::new(py, &s.data), PyBytes::new(py, bytes_of(&offsets)))
}

/// `texts(pieces, path, filtered=None)`: the text of the field at `path` (a top-level
/// key, then keys of nested maps) of every row of `pieces` (as `build` takes them,
/// `filtered` included), as grep sees it (`as_text`), null where missing or nil:
/// `(rows, null_count, validity, data, offsets)` of a string array. None where a
/// value's text is Python's to give (a float, table, array, non-UTF-8 bin) or a
/// piece is outside the native subset.
#[pyfunction]
#[pyo3(signature = (pieces, path, filtered=None))]
fn texts<'py>(
    py: Python<'py>,
    pieces: Vec<(Bound<'py, PyBytes>, Option<i64>, Option<i64>, usize, usize)>,
    path: Vec<String>,
    filtered: Option<Vec<Filtered<'py>>>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let (selections, edits) = unpack_filtered(filtered, pieces.len())?;
    let parts = rows_of(&pieces, &selections, &edits);
    let keys: Vec<&[u8]> = path.iter().map(|k| k.as_bytes()).collect();
    let Ok(found) = guarded(py, || edits::texts(&parts, &keys))? else {
        return Ok(None);
    };
    let (nulls, validity, data, offsets) = strings_tuple(py, &found);
    Ok(Some((found.rows, nulls, validity, data, offsets).into_pyobject(py)?))
}

/// `values(pieces, paths, filtered=None)`: what a condition reads of the fields at
/// `paths` (each a top-level key, then keys of nested maps) of every row, in one walk:
/// per path `(rows, kinds, texts, numbers)`, the kinds one byte per row
/// (`edits::MISSING` .. `edits::RAW_BIN`), the texts `(null_count, validity, data,
/// offsets)` of a string array (valid for str, UTF-8 bin, int and bool), the numbers
/// float64 bytes (int and float). None if a piece is outside the native subset.
#[pyfunction]
#[pyo3(signature = (pieces, paths, filtered=None))]
fn values<'py>(
    py: Python<'py>,
    pieces: Vec<(Bound<'py, PyBytes>, Option<i64>, Option<i64>, usize, usize)>,
    paths: Vec<Vec<String>>,
    filtered: Option<Vec<Filtered<'py>>>,
) -> PyResult<Option<Bound<'py, PyList>>> {
    let (selections, edits) = unpack_filtered(filtered, pieces.len())?;
    let parts = rows_of(&pieces, &selections, &edits);
    let keys: Vec<Vec<&[u8]>> = paths.iter().map(|path| path.iter().map(|k| k.as_bytes()).collect()).collect();
    if keys.iter().any(|path| path.is_empty()) {
        return Err(PyValueError::new_err("paths: each names at least a top-level key"));
    }
    let Ok(found) = guarded(py, || edits::values(&parts, &keys))? else {
        return Ok(None);
    };
    let out = PyList::empty(py);
    for (kinds, strings, numbers) in &found {
        let texts = strings_tuple(py, strings);
        out.append((kinds.len(), PyBytes::new(py, kinds), texts, PyBytes::new(py, bytes_of(numbers))))?;
    }
    Ok(Some(out))
}

/// `entries_at(piece, rows, filtered=None)`: `[(start, end), ...]`, where in the
/// piece's blob the entries of its rows numbered `rows` (ascending, counted among the
/// rows `filtered` selects) lie, to decode only those; None if out of range or outside
/// the subset.
#[pyfunction]
#[pyo3(signature = (piece, rows, filtered=None))]
fn entries_at<'py>(
    py: Python<'py>,
    piece: (Bound<'py, PyBytes>, Option<i64>, Option<i64>, usize, usize),
    rows: Vec<usize>,
    filtered: Option<Filtered<'py>>,
) -> PyResult<Option<Vec<(usize, usize)>>> {
    if rows.windows(2).any(|w| w[0] >= w[1]) {
        return Err(PyValueError::new_err("rows: ascending"));
    }
    let (selections, edits) = unpack_filtered(filtered.map(|f| vec![f]), 1)?;
    let (blob, now, bucket, start, stop) = &piece;
    let part = edits::Rows {
        blob: blob.as_bytes(),
        now: *now,
        bucket: *bucket,
        start: *start,
        stop: *stop,
        selection: selections[0].as_ref().map(|b| b.as_bytes()),
        edits: &edits[0],
    };
    Ok(guarded(py, || edits::entries_at(&part, &rows))?.ok())
}

/// `check_documents(documents)`: whether every JSON document (bytes or bytearray) is
/// an object inside the subset `jsondoc` takes, the part of `scan_documents`' answer
/// that does not depend on times or fields (for tests and tools).
#[pyfunction]
fn check_documents(py: Python<'_>, documents: Vec<Bound<'_, PyAny>>) -> PyResult<bool> {
    let copies = bytearray_copies(&documents)?;
    let docs = document_slices(&documents, &copies);
    guarded(py, || jsondoc::check(&docs))
}

/// Copies of the documents that are bytearrays (a codec's slices of its buffer), which
/// another thread could change while the GIL is released; bytes are read in place.
fn bytearray_copies(documents: &[Bound<'_, PyAny>]) -> PyResult<Vec<Option<Vec<u8>>>> {
    documents
        .iter()
        .map(|d| {
            if d.is_instance_of::<PyBytes>() {
                Ok(None)
            } else {
                Ok(Some(d.cast::<PyByteArray>().map_err(PyErr::from)?.to_vec()))
            }
        })
        .collect()
}

fn document_slices<'a>(documents: &'a [Bound<'_, PyAny>], copies: &'a [Option<Vec<u8>>]) -> Vec<&'a [u8]> {
    documents
        .iter()
        .zip(copies)
        .map(|(d, copy)| match copy {
            Some(bytes) => bytes.as_slice(),
            None => d.cast::<PyBytes>().map(|b| b.as_bytes()).unwrap_or(&[]),
        })
        .collect()
}

/// `scan_documents(documents, now, drop_metadata, paths, key=None)`: None if any
/// document is outside the subset; else `(entries, buckets, values, texts, keys)`: the
/// records as a PackedForward entries blob (what `scan` and `build` take, times as
/// EventTimes, `@metadata` left out with `drop_metadata`), `[(hour bucket, events),
/// ...]` in order of first appearance, and per path (`(lookup, dotted name, keys)`,
/// lookup 0: nested objects, 1: a top-level key with the whole dotted name first) a
/// list of each event's value there: None (missing or null), bool, int, float, str, or
/// `...` for an object or array; and `(index, texts)`, the JSON text of the records'
/// top-level objects and arrays as `build` takes it with the entries
/// (`jsondoc::Scanned`). With `key` `(kind, name, first)` the paths from `first` on are
/// an idempotency key's (`keys::Spec`, kind 0 `"auto"`, 1 a field list named `name`):
/// `values` then stops before them and `keys` is each event's `(sender, digest)` or
/// None, or None where no event has a key (else `keys` is None).
#[pyfunction]
#[pyo3(signature = (documents, now, drop_metadata, paths, key=None))]
fn scan_documents<'py>(
    py: Python<'py>,
    documents: Vec<Bound<'py, PyAny>>,
    now: i64,
    drop_metadata: bool,
    paths: Vec<(u8, String, Vec<String>)>,
    key: Option<(u8, String, usize)>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let copies = bytearray_copies(&documents)?;
    let docs = document_slices(&documents, &copies);
    scanned(py, &docs, None, now, drop_metadata, &paths, key)
}

/// `scan_runs(runs, now, drop_metadata, paths, key=None)`: `scan_documents` of the
/// documents of `runs` (`(buffer, spans)` as `json_frames` cut them out), read in place;
/// of one run, `texts` is `(index, buffer)`: the containers' text where it lies.
#[pyfunction]
#[pyo3(signature = (runs, now, drop_metadata, paths, key=None))]
fn scan_runs<'py>(
    py: Python<'py>,
    runs: Vec<beats::Run<'py>>,
    now: i64,
    drop_metadata: bool,
    paths: Vec<(u8, String, Vec<String>)>,
    key: Option<(u8, String, usize)>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let docs: Vec<&[u8]> = beats::run_documents(&runs)?.into_iter().map(|(_, d)| d).collect();
    let within = if runs.len() == 1 { Some(&runs[0].0) } else { None };
    scanned(py, &docs, within, now, drop_metadata, &paths, key)
}

#[allow(clippy::too_many_arguments)]
fn scanned<'py>(
    py: Python<'py>,
    docs: &[&[u8]],
    within: Option<&Bound<'py, PyBytes>>,
    now: i64,
    drop_metadata: bool,
    paths: &[(u8, String, Vec<String>)],
    key: Option<(u8, String, usize)>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let specs: Vec<jsondoc::Path> = paths
        .iter()
        .map(|(lookup, name, keys)| jsondoc::Path {
            lookup: if *lookup == 1 { jsondoc::Lookup::DottedFirst } else { jsondoc::Lookup::Walk },
            name: name.as_bytes().to_vec(),
            keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
        })
        .collect();
    if specs.iter().any(|p| p.keys.is_empty()) {
        return Ok(None);
    }
    let (key_spec, first) = match &key {
        None => (None, specs.len()),
        Some((kind, name, first)) => {
            let wanted = if *kind == 0 { 6 } else { 2 };
            if *first > specs.len() || specs.len() - first < wanted || (*kind == 0 && specs.len() - first != 6) {
                return Err(PyValueError::new_err("key: (0, name, first) with six paths from first, or (1, name, first) with a field's and the sender's"));
            }
            (Some(if *kind == 0 { keys::Spec::Auto } else { keys::Spec::Fields(name.as_bytes().to_vec()) }), *first)
        }
    };
    let options = jsondoc::Options { within: within.map(|b| b.as_bytes()), key: key_spec.as_ref().map(|spec| (spec, first)) };
    let mut found = match guarded(py, || jsondoc::scan_with(docs, now, drop_metadata, &specs, &options))? {
        Ok(found) => found,
        Err(_) => return Ok(None),
    };
    let values = PyList::empty(py);
    for (column, same) in found.values[..first].iter().zip(&found.same) {
        let list = PyList::empty(py);
        let mut last = None;
        for (v, &same) in column.iter().zip(same) {
            list.append(value_object(py, v, same, &mut last)?)?;
        }
        values.append(list)?;
    }
    let keys = match key_spec {
        Some(_) if found.digests.iter().any(Option::is_some) => {
            let list = PyList::empty(py);
            let (senders, same) = (&found.values[found.values.len() - 1], &found.same[found.values.len() - 1]);
            let mut last: Option<Bound<'py, PyString>> = None;
            for ((digest, sender), &same) in found.digests.iter().zip(senders).zip(same) {
                let sender = match &last {
                    Some(obj) if same => obj.clone(),
                    _ => {
                        let text = std::str::from_utf8(keys::sender(sender)).map_err(|_| PyRuntimeError::new_err("not UTF-8"))?;
                        let obj = PyString::new(py, text);
                        last = Some(obj.clone());
                        obj
                    }
                };
                match digest {
                    None => list.append(py.None())?,
                    Some(digest) => list.append((sender, PyBytes::new(py, digest)))?,
                }
            }
            Some(list)
        }
        _ => None,
    };
    let index = jsondoc::index_words(&found.index);
    let data = match within {
        Some(buffer) => buffer.clone(),
        None => PyBytes::new(py, &found.texts),
    };
    let texts = (PyBytes::new(py, bytes_of(&index)), data);
    let entries = PyBytes::new(py, &found.blob);
    let buckets = std::mem::take(&mut found.buckets);
    found.recycle();
    let result = (entries, buckets, values, texts, keys).into_pyobject(py)?;
    Ok(Some(result))
}

/// A scanned value as Python's; `last` keeps the str of the run of equal texts (events
/// of one sender mostly repeat a field's text: one str object for a run), `same` says
/// this value is the previous one (`jsondoc::Scanned::same`).
fn value_object<'py>(py: Python<'py>, v: &jsonparse::Val<'_>, same: bool, last: &mut Option<Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        jsonparse::Val::Missing => py.None().into_bound(py),
        jsonparse::Val::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        jsonparse::Val::Int(i) => i.into_pyobject(py)?.into_any(),
        jsonparse::Val::Float(f) => f.into_pyobject(py)?.into_any(),
        jsonparse::Val::Container => py.Ellipsis().into_bound(py),
        jsonparse::Val::Str(_) | jsonparse::Val::Owned(_) => {
            let bytes: &[u8] = match v {
                jsonparse::Val::Str(s) => s,
                jsonparse::Val::Owned(s) => s,
                _ => unreachable!(),
            };
            match last {
                Some(obj) if same => obj.clone(),
                _ => {
                    let text = std::str::from_utf8(bytes).map_err(|_| PyRuntimeError::new_err("not UTF-8"))?;
                    let obj = PyString::new(py, text).into_any();
                    *last = Some(obj.clone());
                    obj
                }
            }
        }
    })
}

#[pymodule]
fn logrouter_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scan, m)?)?;
    m.add_function(wrap_pyfunction!(frame_entries, m)?)?;
    m.add_function(wrap_pyfunction!(forward_frames, m)?)?;
    m.add_function(wrap_pyfunction!(build, m)?)?;
    m.add_function(wrap_pyfunction!(texts, m)?)?;
    m.add_function(wrap_pyfunction!(values, m)?)?;
    m.add_function(wrap_pyfunction!(entries_at, m)?)?;
    m.add_function(wrap_pyfunction!(check_documents, m)?)?;
    m.add_function(wrap_pyfunction!(scan_documents, m)?)?;
    m.add_function(wrap_pyfunction!(logjam::scan_logjam, m)?)?;
    m.add_class::<logjam::LogjamReader>()?;
    m.add_function(wrap_pyfunction!(logjam::join_logjam, m)?)?;
    m.add_function(wrap_pyfunction!(scan_runs, m)?)?;
    m.add_function(wrap_pyfunction!(beats::json_frames, m)?)?;
    m.add_function(wrap_pyfunction!(beats::split_documents, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
