//! Fusion: which ops share a kernel, at which level, with which parameters.
//!
//! - [`class`]: each op's role and mapping type;
//! - [`legality`]: the edge rule table and the kernel shapes a group may take;
//! - [`device`]: the GPU as the cost model sees it;
//! - [`group`]: a candidate group of ops;
//! - [`cost`]: the DeepCuts performance model (PUL) and roofline estimates;
//! - [`target`]: what a backend lowers, asked by the planner;
//! - [`library`]: which groups a vendor library runs, and at what cost;
//! - [`planner`], [`apply`]: the partition search and the rewrite into `fused` ops;
//! - [`plan_layout`]: the graph planned as written and channels-last, the faster kept.

pub mod class;
pub mod cost;
pub mod device;
pub mod group;
pub mod legality;
pub mod library;
mod storage;
pub mod target;

pub use cost::{Bound, CostModel, Estimate, Estimator, KernelParams, LibraryVerdict};
pub use device::{DeviceSpec, LiveDevice};
pub use group::Group;
pub use legality::{EdgeRule, GroupKind, Level, check_group, edge_rule, group_kind};
pub use library::{GemmCall, Libraries};
pub use storage::{ConcatStorage, Slot, concat_storage};
pub use target::{
    Accepted, AnyGroup, HOPPER_RING_ALIGN, HOPPER_TK, HopperBlocking, HopperConvSteps, Reason,
    Refusal, Target, attention_tensor_core, hopper_conv_steps, pool_walks_nhwc,
    vector_access_width,
};
pub mod planner;

pub use planner::{Plan, PlannedGroup, Rejected, Rejection, plan_graph, plan_unfused};
pub mod apply;

pub use apply::apply_plan;
pub mod explain;
mod layout;

pub use layout::{
    CHANNELS_LAST_MARGIN, CHANNELS_LAST_PART_MARGIN, CHANNELS_LAST_PIPELINE, LayoutChoice,
    LayoutMode, channels_last_form, plan_layout, unshare_views,
};
mod replan;

pub use replan::{GROUP_ATTRS, fused_plan};
mod pass;

pub use pass::{FUSE_NAME, FUSE_OPTIONS, FUSE_SUMMARY, fuse_pass};
