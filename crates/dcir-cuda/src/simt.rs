//! The SIMT contraction kind, shared by every family that multiplies with
//! FMAs (the SIMT gemm and implicit-GEMM conv, the contraction chain, FMA
//! attention, the depthwise → pointwise block): a tile of a value staged
//! into a shared array through its index map ([`Tile`], [`stage`],
//! [`stage_as`]), and the rank-1 update of a thread's micro-tile of f32
//! accumulators from two k-major shared arrays ([`rank1_update`]). The SIMT
//! gemm carries its tiles one step ahead in registers (`gemm::Stage`) and
//! multiplies with [`rank1_update`] as the others do.

use dcir_ir::{DType, ValueId};

use super::gemm::Element;
use super::{EmitError, Index, Lower, vector_lane, vector_ty};
use crate::kir::{
    ArrayRef, Builtin, Expr, Helper, Stmt, Ty, add, all, array, at, call, div, guarded, int,
    let_float, let_int, lt, mul, rem, unrolled, var,
};

type Result<T> = std::result::Result<T, EmitError>;

/// The bound a tile of `extent` starting at multiples of `extent` (when
/// `aligned`) must check against `bound`: `None` when it never crosses it.
pub(super) fn crossing(bound: usize, extent: usize, aligned: bool) -> Option<usize> {
    (!aligned || !bound.is_multiple_of(extent)).then_some(bound)
}

/// A `rows × cols` tile of a value staged into a shared array through its
/// index map: element `(r, c)` is the value at `index(origin[0] + r,
/// origin[1] + c)`, stored at `slot(r, c)`; elements at or past `bounds` are
/// stored as zero without being loaded (`None`: the tile never crosses it).
pub(super) struct Tile<'a> {
    /// The value read.
    pub value: ValueId,
    /// The shared array (also the prefix of the loop's locals).
    pub shared: &'a str,
    /// Tile extents.
    pub rows: usize,
    pub cols: usize,
    /// Global row and column of the tile's first element.
    pub origin: [Expr; 2],
    /// Global row and column bounds.
    pub bounds: [Option<usize>; 2],
    /// The value's index at a global (row, column).
    pub index: &'a dyn Fn(Expr, Expr) -> Index,
    /// The shared position of a tile (row, column).
    pub slot: &'a dyn Fn(Expr, Expr) -> Expr,
    /// Walk columns fastest (when they are contiguous in memory), else rows.
    pub cols_inner: bool,
}

/// The loop that stages `t` with `threads` threads, each element once.
pub(super) fn stage(l: &mut Lower, t: &Tile, threads: usize) -> Result<Stmt> {
    stage_as(l, t, threads, Ty::F32)
}

/// [`stage`] into a shared array of `stored` elements: f32, or the bits of
/// an f16 or bf16 (each element rounded once, to nearest even).
pub(super) fn stage_as(l: &mut Lower, t: &Tile, threads: usize, stored: Ty) -> Result<Stmt> {
    let s = t.shared;
    let convert = match stored {
        Ty::F16Bits => Some((Helper::Half, "dcir_f2h")),
        Ty::Bf16Bits => Some((Helper::Bfloat16, "dcir_f2bf")),
        _ => None,
    };
    if let Some((helper, _)) = convert {
        l.helpers.insert(helper);
    }
    let put = |index: Expr, v: Expr| {
        let v = match convert {
            Some((_, f)) => call(f, vec![v]),
            None => v,
        };
        Stmt::Store(
            ArrayRef {
                name: s.into(),
                ty: stored,
                reinterpret: false,
            },
            index,
            v,
        )
    };
    let (i, r, c, row, col, val) = (
        format!("{s}_i"),
        format!("{s}_r"),
        format!("{s}_c"),
        format!("{s}_row"),
        format!("{s}_col"),
        format!("{s}_val"),
    );
    for n in [&i, &r, &c, &row, &col, &val] {
        l.used_names.insert(n.clone());
    }
    let (r_of, c_of) = if t.cols_inner {
        (div(var(&i), t.cols as i64), rem(var(&i), t.cols as i64))
    } else {
        (rem(var(&i), t.rows as i64), div(var(&i), t.rows as i64))
    };
    let conds = vec![
        t.bounds[0].map(|b| lt(var(&row), int(b as i64))),
        t.bounds[1].map(|b| lt(var(&col), int(b as i64))),
    ];
    let load = l.scoped(|l| {
        let v = l.value_at(t.value, &(t.index)(var(&row), var(&col)))?;
        l.body.push(Stmt::Assign(val.clone(), v));
        Ok(())
    })?;
    let mut body = vec![
        let_int(&r, r_of),
        let_int(&c, c_of),
        let_int(&row, add(t.origin[0].clone(), var(&r))),
        let_int(&col, add(t.origin[1].clone(), var(&c))),
    ];
    if conds.iter().all(Option::is_none) {
        body.extend(load);
        let Some(Stmt::Assign(_, v)) = body.pop() else {
            unreachable!("the load ends with its assignment")
        };
        body.push(put((t.slot)(var(&r), var(&c)), v));
    } else {
        body.push(let_float(&val, Expr::F32(0.0), false));
        body.extend(guarded(conds, load));
        body.push(put((t.slot)(var(&r), var(&c)), var(&val)));
    }
    let total = t.rows * t.cols;
    Ok(Stmt::For {
        var: i,
        start: Expr::Builtin(Builtin::ThreadX),
        end: int(total as i64),
        step: int(threads as i64),
        unroll: total.is_multiple_of(threads) && total / threads <= 32,
        body,
    })
}

/// One operand's fragment in a rank-1 update: `len` f32 values of the
/// shared array `shared` (declared as `declared`: `float` or `float4`) read
/// `width` at a time (1, 2 or 4: `float`, `float2`, `float4`), group `q` at
/// `base + q·step` counted in units of `width`.
pub(super) struct Fragment<'a> {
    pub shared: &'a str,
    pub declared: Ty,
    pub base: Expr,
    pub step: usize,
    pub len: usize,
    pub width: usize,
}

impl Fragment<'_> {
    /// A fragment read one element at a time: element `i` at `base + i·step`.
    pub(super) fn scalar(shared: &str, base: Expr, step: usize, len: usize) -> Fragment<'_> {
        Fragment {
            shared,
            declared: Ty::F32,
            base,
            step,
            len,
            width: 1,
        }
    }

    /// `float name[len];` filled from shared memory.
    pub(super) fn load(&self, name: &str) -> Vec<Stmt> {
        let ty = match self.width {
            4 => Ty::Float4,
            2 => Ty::Float2,
            _ => Ty::F32,
        };
        let at = add(self.base.clone(), mul(var("q"), int(self.step as i64)));
        let body = if self.width == 1 {
            vec![Stmt::Store(
                array(name, Ty::F32),
                var("q"),
                Expr::Load(shared_as(self.shared, self.declared, ty), Box::new(at)),
            )]
        } else {
            let v = format!("{name}{}", self.width);
            let mut body = vec![Stmt::Let {
                name: v.clone(),
                ty,
                value: Expr::Load(shared_as(self.shared, self.declared, ty), Box::new(at)),
                constant: true,
            }];
            for (j, f) in ["x", "y", "z", "w"][..self.width].iter().enumerate() {
                body.push(Stmt::Store(
                    array(name, Ty::F32),
                    add(mul(var("q"), int(self.width as i64)), int(j as i64)),
                    Expr::Field(Box::new(var(&v)), f),
                ));
            }
            body
        };
        vec![
            Stmt::LocalArray {
                name: name.into(),
                ty: Ty::F32,
                len: self.len,
            },
            unrolled("q", self.len / self.width, body),
        ]
    }
}

/// Shared array `name`, declared as `declared`, accessed as `ty`.
pub(super) fn shared_as(name: &str, declared: Ty, ty: Ty) -> ArrayRef {
    ArrayRef {
        name: name.into(),
        ty,
        reinterpret: ty != declared,
    }
}

/// One rank-1 update of a thread's micro-tile: fragments `a` and `b` loaded
/// into `a_frag` and `b_frag`, then `acc[i·b.len + j] += a_frag[i] ·
/// b_frag[j]` for every `i < a.len`, `j < b.len`.
pub(super) fn rank1_update(acc: &str, a: &Fragment, b: &Fragment) -> Vec<Stmt> {
    let mut out = a.load("a_frag");
    out.extend(b.load("b_frag"));
    let ij = add(mul(var("i"), int(b.len as i64)), var("j"));
    out.push(unrolled(
        "i",
        a.len,
        vec![unrolled(
            "j",
            b.len,
            vec![Stmt::Store(
                array(acc, Ty::F32),
                ij.clone(),
                call(
                    "fmaf",
                    vec![at("a_frag", var("i")), at("b_frag", var("j")), at(acc, ij)],
                ),
            )],
        )],
    ));
    out
}

/// One operand's tile carried from global memory to registers (the
/// prefetch, issued a k tile ahead by the SIMT gemm's mainloop) and from
/// registers to its shared buffer.
///
/// The tile is `rows × tk` (`rows` along M for A, N for B), stored k-major:
/// element `(r, k)` of buffer `buf` at `(buf·tk + k)·ld + r`. It is walked in
/// units of `width` elements along the operand's contiguous dimension, unit
/// `e` by thread `e mod threads` into its register slot `e / threads`.
pub(super) struct Prefetch<'c> {
    /// Prefix of the locals (`a`, `b`).
    pub name: &'static str,
    /// The shared array (`As`, `Bs`).
    pub shared: &'static str,
    /// The value read (a group input when `width` > 1).
    pub value: ValueId,
    /// The operand's dtype.
    pub dtype: DType,
    /// Tile rows and the GEMM extent along them (M or N).
    pub rows: usize,
    pub extent: usize,
    pub tk: usize,
    pub threads: usize,
    /// Elements per access: 4 (a vector) or 1.
    pub width: usize,
    /// Whether threads walk K fastest (the operand is contiguous along K).
    pub k_inner: bool,
    /// Shared row length: `rows`, plus 4 when `k_inner` (the stores
    /// transpose; the padding spreads them over the banks).
    pub ld: usize,
    /// The operand's extent along k.
    pub k_extent: usize,
    /// Element `(row, k)` of the operand (GEMM indices).
    pub element: &'c dyn Fn(&Lower, Expr, Expr) -> Element,
}

impl Prefetch<'_> {
    fn local(&self, what: &str) -> String {
        format!("{}_{what}", self.name)
    }

    /// Access units in the tile.
    fn units(&self) -> usize {
        self.rows * self.tk / self.width
    }

    /// Register slots per thread.
    pub(super) fn slots(&self) -> usize {
        self.units().div_ceil(self.threads)
    }

    /// The register type of one slot.
    pub(super) fn slot_ty(&self) -> Ty {
        if self.width == 1 {
            Ty::F32
        } else {
            vector_ty(self.dtype, self.width)
        }
    }

    /// `(lets, r, k)`: the tile row and k of slot `i`'s first element, and
    /// the condition that the slot is used at all (when the units do not
    /// divide among the threads).
    fn slot(&self) -> (Vec<Stmt>, Expr, Expr, Option<Expr>) {
        let (e, r, k) = (self.local("e"), self.local("r"), self.local("k"));
        let unit = add(
            Expr::Builtin(Builtin::ThreadX),
            mul(var("i"), int(self.threads as i64)),
        );
        let (row, kk) = if self.k_inner {
            let per_row = (self.tk / self.width) as i64;
            (
                div(var(&e), per_row),
                mul(rem(var(&e), per_row), int(self.width as i64)),
            )
        } else {
            let per_k = (self.rows / self.width) as i64;
            (
                mul(rem(var(&e), per_k), int(self.width as i64)),
                div(var(&e), per_k),
            )
        };
        let lets = vec![let_int(&e, unit), let_int(&r, row), let_int(&k, kk)];
        let used = (!self.units().is_multiple_of(self.threads))
            .then(|| lt(var(&e), int(self.units() as i64)));
        (lets, var(&r), var(&k), used)
    }

    /// Loads this thread's share of the tile starting at `k0` (and at the
    /// block's first row `row0`) into its registers, zero past the GEMM's
    /// extents and outside the operand.
    pub(super) fn load(&self, l: &mut Lower, row0: &Expr, k0: Expr) -> Result<Stmt> {
        let (mut body, r, k, used) = self.slot();
        let (g_row, g_k) = (self.local("row"), self.local("kg"));
        body.push(let_int(&g_row, add(row0.clone(), r)));
        body.push(let_int(&g_k, add(k0, k)));
        let element = (self.element)(l, var(&g_row), var(&g_k));
        body.extend(element.lets.iter().map(|(n, e)| let_int(n, e.clone())));
        let bounds = all([
            (!self.extent.is_multiple_of(self.rows))
                .then(|| lt(var(&g_row), int(self.extent as i64))),
            (!self.k_extent.is_multiple_of(self.tk))
                .then(|| lt(var(&g_k), int(self.k_extent as i64))),
        ]
        .into_iter()
        .chain(element.inside.iter().cloned().map(Some)));
        let slot = array(&self.local("ld"), self.slot_ty());
        let zero = match self.slot_ty() {
            Ty::Float4 => call("make_float4", vec![Expr::F32(0.0); 4]),
            Ty::Uint2 => call("make_uint2", vec![int(0); 2]),
            _ => Expr::F32(0.0),
        };
        let load = l.scoped(|l| {
            let v = if self.width == 1 {
                l.value_at(self.value, &element.index)?
            } else {
                // A group input: the vector holding the element.
                let param = l.inputs[&self.value].clone();
                let at = div(element.index.get_linear(), self.width as i64);
                Expr::Load(
                    ArrayRef {
                        name: param,
                        ty: self.slot_ty(),
                        reinterpret: true,
                    },
                    Box::new(at),
                )
            };
            l.body.push(Stmt::Store(slot.clone(), var("i"), v));
            Ok(())
        })?;
        match bounds {
            None => body.extend(load),
            Some(cond) => {
                body.push(Stmt::Store(slot.clone(), var("i"), zero));
                body.push(Stmt::If(cond, load));
            }
        }
        Ok(unrolled("i", self.slots(), guarded_slot(used, body)))
    }

    /// Stores this thread's registers into shared buffer `buf`.
    pub(super) fn store(&self, l: &mut Lower, buf: &Expr) -> Stmt {
        let (mut body, r, k, used) = self.slot();
        let slot = Expr::Load(array(&self.local("ld"), self.slot_ty()), Box::new(var("i")));
        let at = |k: Expr| {
            add(
                mul(
                    add(mul(buf.clone(), int(self.tk as i64)), k),
                    int(self.ld as i64),
                ),
                r.clone(),
            )
        };
        if self.width == 1 {
            body.push(Stmt::Store(
                shared_as(self.shared, Ty::Float4, Ty::F32),
                at(k),
                slot,
            ));
            return unrolled("i", self.slots(), guarded_slot(used, body));
        }
        // The vector's four elements, as f32.
        let lanes: Vec<Expr> = if self.dtype == DType::F32 {
            ["x", "y", "z", "w"]
                .iter()
                .map(|f| Expr::Field(Box::new(slot.clone()), f))
                .collect()
        } else {
            let v = self.local("v");
            body.push(Stmt::Let {
                name: v.clone(),
                ty: self.slot_ty(),
                value: slot.clone(),
                constant: true,
            });
            (0..self.width)
                .map(|lane| {
                    let bits = vector_lane(v.clone(), self.dtype, self.width, lane);
                    l.widen(self.dtype, bits)
                })
                .collect()
        };
        if self.k_inner {
            // Four consecutive k: a column of the k-major tile.
            for (j, lane) in lanes.into_iter().enumerate() {
                body.push(Stmt::Store(
                    shared_as(self.shared, Ty::Float4, Ty::F32),
                    at(add(k.clone(), int(j as i64))),
                    lane,
                ));
            }
        } else {
            // Four consecutive rows: one float4 of a k row.
            let value = if self.dtype == DType::F32 {
                slot
            } else {
                call("make_float4", lanes)
            };
            body.push(Stmt::Store(
                shared_as(self.shared, Ty::Float4, Ty::Float4),
                div(at(k), 4),
                value,
            ));
        }
        unrolled("i", self.slots(), guarded_slot(used, body))
    }
}

/// A slot's body, under `if (used)` when not every thread has that slot.
fn guarded_slot(used: Option<Expr>, mut body: Vec<Stmt>) -> Vec<Stmt> {
    match used {
        None => body,
        Some(cond) => {
            // The unit index must be declared before the test.
            let first = body.remove(0);
            vec![first, Stmt::If(cond, body)]
        }
    }
}
