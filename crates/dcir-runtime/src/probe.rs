//! Asking the libraries on this machine, before a plan is made, whether
//! they run a call: the planner offers only calls they accept, so a shape or
//! alignment a library refuses is a lost candidate with its reason, never a
//! failed run.
//!
//! A call is prepared as the executor prepares it (descriptors, the
//! algorithm within the workspace limit), over stand-in pointers aligned as
//! the memory plan aligns buffers ([`crate::ALIGN`]), and the answer is kept
//! per call.

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;
use dcir_artifact::LibraryCall;

use crate::error::RuntimeError;
use crate::{cudnn, library};

/// The libraries of one device, asked call by call.
pub struct LibraryProbe {
    ctx: Arc<CudaContext>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// cuBLASLt's handle, or why it did not open.
    blas: Option<Result<library::Handle, String>>,
    /// cuDNN's.
    dnn: Option<Result<cudnn::Handle, String>>,
    /// Every call asked about, with its answer.
    answers: Vec<(LibraryCall, Result<(), String>)>,
}

impl LibraryProbe {
    /// The libraries of device `ordinal` (opened on first use).
    pub fn new(ordinal: usize) -> Result<LibraryProbe, RuntimeError> {
        if !crate::driver_present() {
            return Err(RuntimeError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| RuntimeError::NoDevice {
            ordinal,
            error: format!("{e:?}"),
        })?;
        Ok(LibraryProbe {
            ctx,
            state: Mutex::new(State::default()),
        })
    }

    /// `Ok` when the library prepares `call` on this device; else what it
    /// said.
    pub fn check(&self, call: &LibraryCall) -> Result<(), String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, answer)) = state.answers.iter().find(|(c, _)| c == call) {
            return answer.clone();
        }
        let answer = self.prepare(&mut state, call);
        state.answers.push((call.clone(), answer.clone()));
        answer
    }

    fn prepare(&self, state: &mut State, call: &LibraryCall) -> Result<(), String> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| format!("binding the device's context: {e:?}"))?;
        // Stand-in buffers, each aligned as the memory plan aligns buffers.
        let pointers: Vec<u64> = (1..=5).map(|i| i * crate::ALIGN).collect();
        match call {
            LibraryCall::Cublaslt(call) => {
                let handle = state.blas.get_or_insert_with(library::Handle::new);
                let handle = handle.as_ref().map_err(Clone::clone)?;
                library::Matmul::new(handle, call, &pointers).map(drop)
            }
            LibraryCall::Cudnn(call) => {
                let handle = state
                    .dnn
                    .get_or_insert_with(|| cudnn::Handle::new(std::ptr::null_mut()));
                let handle = handle.as_ref().map_err(Clone::clone)?;
                cudnn::Conv::new(handle, call, &pointers).map(drop)
            }
        }
    }
}
