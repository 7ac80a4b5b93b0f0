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
use pyo3::types::{PyBytes, PyList, PyTuple};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub mod columns;
pub mod frame;
pub mod json;
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
///
/// `checked=True` says every piece's blob got a result from `scan` (in this process):
/// its strings, keys and nesting are then not checked again. Never pass it for bytes
/// that were not scanned.
#[pyfunction]
#[pyo3(signature = (pieces, schema, build=true, checked=false))]
fn build<'py>(
    py: Python<'py>,
    pieces: Vec<(Bound<'py, PyBytes>, Option<i64>, Option<i64>, usize, usize)>,
    schema: Vec<(String, u8)>,
    build: bool,
    checked: bool,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let parts: Vec<columns::Piece> =
        pieces.iter().map(|(blob, now, bucket, start, stop)| columns::Piece {
        blob: blob.as_bytes(),
        now: *now,
        bucket: *bucket,
        start: *start,
        stop: *stop,
        checked,
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

#[pymodule]
fn logrouter_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scan, m)?)?;
    m.add_function(wrap_pyfunction!(frame_entries, m)?)?;
    m.add_function(wrap_pyfunction!(build, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
