//! Buffers built in Rust handed to Python as they are, without a copy.
//!
//! A row group's Arrow buffers (`columns::run`) are as large as the row group's
//! events; copying each into a `bytes` object cost as much as building most of them.
//! An `Owned` keeps the vector and lends its bytes through the buffer protocol
//! (read-only), which `pyarrow.py_buffer` takes, keeping the `Owned` alive as long
//! as an Arrow array holds the memory.

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes};
use std::os::raw::{c_int, c_void};

/// The vectors `columns::Output` holds.
enum Held {
    Bytes(Vec<u8>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

#[pyclass(frozen, module = "logrouter_native")]
pub struct Owned {
    held: Held,
}

impl Owned {
    fn of(held: Held) -> Self {
        Owned { held }
    }

    pub fn bytes(mut data: Vec<u8>) -> Self {
        data.shrink_to_fit(); // grown by doubling: what it holds is what stays
        Self::of(Held::Bytes(data))
    }

    pub fn i32s(mut data: Vec<i32>) -> Self {
        data.shrink_to_fit();
        Self::of(Held::I32(data))
    }

    pub fn i64s(mut data: Vec<i64>) -> Self {
        data.shrink_to_fit();
        Self::of(Held::I64(data))
    }

    fn as_bytes(&self) -> &[u8] {
        match &self.held {
            Held::Bytes(v) => v,
            Held::I32(v) => crate::bytes_of(v),
            Held::I64(v) => crate::bytes_of(v),
        }
    }
}

#[pymethods]
impl Owned {
    /// # Safety
    /// `view` is the `Py_buffer` CPython asks to fill; the object it points at keeps
    /// `slf` (and so the vector, which is never changed) alive.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no view to fill"));
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("read-only"));
        }
        let data = slf.get().as_bytes();
        // SAFETY: as above; readonly = 1.
        let filled = unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), data.as_ptr() as *mut c_void, data.len() as ffi::Py_ssize_t, 1, flags) };
        if filled == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.as_bytes().len()
    }

    /// Equal to an `Owned` or a `bytes` of the same bytes (what the tests compare).
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        let py = other.py();
        let same = match other.cast::<Owned>() {
            Ok(other) => Some(self.as_bytes() == other.get().as_bytes()),
            Err(_) => other.cast::<PyBytes>().ok().map(|other| self.as_bytes() == other.as_bytes()),
        };
        match same {
            Some(same) => PyBool::new(py, same).to_owned().into_any().unbind(),
            None => py.NotImplemented(),
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("Owned({})", PyBytes::new(py, self.as_bytes()).repr()?))
    }

    /// A copy as `bytes` (tests and debugging; the lake never needs one).
    fn __bytes__(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}
