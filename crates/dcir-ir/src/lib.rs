//! dcir's intermediate representation: the data model every other crate shares.
//!
//! A [`Module`] holds [`Graph`]s. A graph is a function in SSA form over
//! statically shaped tensors ([`TensorType`]); its ops come from a closed set
//! ([`OpKind`]) described by a static op table ([`OpInfo`]) with attribute
//! schemas and type rules ([`shape`]). Fusion groups are `fused` ops owning a
//! region. [`GraphBuilder`] constructs graphs, [`print`] writes the canonical
//! text, [`verify`] checks every invariant.
//!
//! Architecture invariant: this crate knows no text parsing, no device and no
//! buffer. Reading text is `dcir-reader`'s job.

pub mod attr;
pub mod builder;
pub mod fused;
pub mod graph;
pub mod op;
pub mod print;
pub mod shape;
pub mod types;
pub mod verify;

pub use attr::{Attr, AttrKind, Attrs};
pub use builder::{BuildError, GraphBuilder, Rewriter};
pub use graph::{
    BlockData, BlockId, Graph, GraphError, Location, Module, OpData, OpId, Span, ValueData,
    ValueDef, ValueId,
};
pub use op::{Arity, AttrDefault, AttrError, AttrSpec, OpInfo, OpKind, ResultTypes};
pub use print::{print_graph, print_module};
pub use types::{DType, Shape, TensorType};
pub use verify::{MAX_TENSOR_BYTES, VerifyError, verify_graph, verify_module};
