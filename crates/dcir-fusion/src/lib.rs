//! Fusion: which ops share a kernel, at which level, with which parameters.
//!
//! - [`class`]: each op's role and mapping type;
//! - [`legality`]: the edge rule table and the kernel shapes a group may take;
//! - [`device`]: the GPU as the cost model sees it.

pub mod class;
pub mod device;
pub mod legality;

pub use device::DeviceSpec;
pub use legality::{EdgeRule, GroupKind, Level, edge_rule, group_kind};
