//! logrouter's native decoders, a Python extension module (`logrouter_native`).
//!
//! Forward PackedForward entries go from the received bytes straight into the Arrow
//! buffers of a lake row group (`columns`), with the GIL released while they are
//! read. Only the subset `reader` describes is taken; for anything else (and for any
//! malformed input) the functions answer None and logrouter's Python path, the
//! reference, decodes it. No Arrow library is linked: the buffers go to pyarrow as
//! bytes (`pyarrow.Array.from_buffers`). Python keeps the control plane.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString, PyTuple};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub mod columns;
pub mod json;
pub mod jsondoc;
pub mod jsonparse;
pub mod reader;

/// Run `work` without the GIL; a panic (a bug, never an input's doing) becomes a
/// RuntimeError instead of unwinding into Python.
fn guarded<T: Send>(py: Python<'_>, work: impl FnOnce() -> T + Send) -> PyResult<T> {
    py.detach(|| catch_unwind(AssertUnwindSafe(work)))
        .map_err(|_| PyRuntimeError::new_err("logrouter_native panicked (a bug): the Python path takes over"))
}

fn bytes_of<T: Copy>(values: &[T]) -> &[u8] {
    // Arrow buffers are native-endian: the values' own bytes are what it reads.
    unsafe { std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values)) }
}

/// `scan(blob, now)`: None if the entries blob is outside the native subset (or
/// malformed); else `(entries, needs_now, [(hour bucket, entries), ...])`, the buckets
/// in order of first appearance. Time-0 entries take `now`; with `now` None they only
/// set `needs_now` and are left out of the buckets.
#[pyfunction]
#[pyo3(signature = (blob, now=None))]
fn scan(py: Python<'_>, blob: &Bound<'_, PyBytes>, now: Option<i64>) -> PyResult<Option<(usize, bool, Vec<(i64, usize)>)>> {
    let data = blob.as_bytes();
    let found = guarded(py, || reader::scan(data, now))?;
    Ok(found.ok().map(|s| (s.entries, s.needs_now, s.buckets)))
}

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
/// `build=False` only `rows`, `times` and `fields` are filled.
#[pyfunction]
#[pyo3(signature = (pieces, schema, build=true))]
fn build<'py>(
    py: Python<'py>,
    pieces: Vec<(Bound<'py, PyBytes>, Option<i64>, Option<i64>, usize, usize)>,
    schema: Vec<(String, u8)>,
    build: bool,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let parts: Vec<columns::Piece> =
        pieces.iter().map(|(blob, now, bucket, start, stop)| columns::Piece {
        blob: blob.as_bytes(),
        now: *now,
        bucket: *bucket,
        start: *start,
        stop: *stop,
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

/// `scan_documents(documents, now, drop_metadata, paths)`: None if any document is
/// outside the subset; else `(entries, buckets, values)`: the records as a
/// PackedForward entries blob (what `scan` and `build` take, times as EventTimes,
/// `@metadata` left out with `drop_metadata`), `[(hour bucket, events), ...]` in order
/// of first appearance, and per path (`(lookup, dotted name, keys)`, lookup 0: nested
/// objects, 1: a top-level key with the whole dotted name first) a list of each
/// event's value there: None (missing or null), bool, int, float, str, or `...` for
/// an object or array.
#[pyfunction]
fn scan_documents<'py>(
    py: Python<'py>,
    documents: Vec<Bound<'py, PyAny>>,
    now: i64,
    drop_metadata: bool,
    paths: Vec<(u8, String, Vec<String>)>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let copies = bytearray_copies(&documents)?;
    let docs = document_slices(&documents, &copies);
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
    let found = match guarded(py, || jsondoc::scan(&docs, now, drop_metadata, &specs))? {
        Ok(found) => found,
        Err(_) => return Ok(None),
    };
    let values = PyList::empty(py);
    for column in &found.values {
        let list = PyList::empty(py);
        // Events of one sender mostly repeat a field's text: one str object for a run.
        let mut last: Option<(&[u8], Bound<'py, PyAny>)> = None;
        for v in column {
            let item: Bound<'py, PyAny> = match v {
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
                    match &last {
                        Some((text, obj)) if *text == bytes => obj.clone(),
                        _ => {
                            let text = std::str::from_utf8(bytes).map_err(|_| PyRuntimeError::new_err("not UTF-8"))?;
                            let obj = PyString::new(py, text).into_any();
                            last = Some((bytes, obj.clone()));
                            obj
                        }
                    }
                }
            };
            list.append(item)?;
        }
        values.append(list)?;
    }
    let result = (PyBytes::new(py, &found.blob), found.buckets, values).into_pyobject(py)?;
    Ok(Some(result))
}

#[pymodule]
fn logrouter_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scan, m)?)?;
    m.add_function(wrap_pyfunction!(build, m)?)?;
    m.add_function(wrap_pyfunction!(check_documents, m)?)?;
    m.add_function(wrap_pyfunction!(scan_documents, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
