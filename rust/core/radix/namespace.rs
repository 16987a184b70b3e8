//! Namespace interning: a namespace string (LoRA adapter, cache salt) is
//! stored once and named by a small [`Ns`] id in every node and child key.
//!
//! # Invariants
//! - id 0 is "no namespace" and has no name;
//! - `ids` maps each live name to its id and `names[id]` back to it;
//! - `roots[id]` counts the root's children in namespace `id`; a named id
//!   is live iff that count is positive, and dead ids are in `free`
//!   (recycled), so `ids.len() + 1 + free.len() == names.len()`.
//!
//! # Costs
//! Lookup and interning: one hash-map probe on the name (O(name length)).
//! Memory: the live names, plus 8 bytes per id ever issued.

use rustc_hash::FxHashMap;

/// An interned namespace. [`Ns::NONE`] is "no namespace".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ns(pub u32);

impl Ns {
    /// No namespace.
    pub const NONE: Ns = Ns(0);
}

/// Interned namespace strings. A namespace's id lives while the root has a
/// child in it; ids are recycled afterwards, so memory tracks tree content.
#[derive(Clone, Debug, Default)]
pub(super) struct Namespaces {
    pub(super) ids: FxHashMap<Box<str>, u32>,
    /// `names[id]` (index 0 = no namespace, always `None`).
    pub(super) names: Vec<Option<Box<str>>>,
    /// Root children per namespace id.
    pub(super) roots: Vec<u32>,
    pub(super) free: Vec<u32>,
}

impl Namespaces {
    pub(super) fn new() -> Self {
        Namespaces { ids: FxHashMap::default(), names: vec![None], roots: vec![0], free: Vec::new() }
    }

    pub(super) fn lookup(&self, ns: Option<&str>) -> Option<Ns> {
        match ns {
            None => Some(Ns::NONE),
            Some(s) => self.ids.get(s).map(|&i| Ns(i)),
        }
    }

    pub(super) fn intern(&mut self, ns: Option<&str>) -> Ns {
        let Some(s) = ns else { return Ns::NONE };
        if let Some(&i) = self.ids.get(s) {
            return Ns(i);
        }
        let i = if let Some(i) = self.free.pop() {
            self.names[i as usize] = Some(s.into());
            i
        } else {
            self.names.push(Some(s.into()));
            self.roots.push(0);
            u32::try_from(self.names.len() - 1).expect("fewer than 2^32 namespaces")
        };
        self.ids.insert(s.into(), i);
        Ns(i)
    }

    pub(super) fn name(&self, ns: Ns) -> Option<&str> {
        self.names[ns.0 as usize].as_deref()
    }

    pub(super) fn add_root_child(&mut self, ns: Ns) {
        self.roots[ns.0 as usize] += 1;
    }

    pub(super) fn remove_root_child(&mut self, ns: Ns) {
        let r = &mut self.roots[ns.0 as usize];
        *r = r.checked_sub(1).expect("namespace root count underflow");
        if *r == 0 && ns != Ns::NONE {
            let name = self.names[ns.0 as usize].take().expect("live namespace has a name");
            self.ids.remove(&name);
            self.free.push(ns.0);
        }
    }

    pub(super) fn clear(&mut self) {
        *self = Namespaces::new();
    }
}
