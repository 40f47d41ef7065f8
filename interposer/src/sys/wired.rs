//! A value a layer is handed at load by the layer that wires the layers together
//! (`lifecycle`): how a layer asks a layer beside it without importing it. Until it is
//! wired (a test binary that links the layer alone), the value given at compile time.

use std::sync::OnceLock;

pub(crate) struct Wired<T: 'static> {
    cell: OnceLock<T>,
    unwired: T,
}

impl<T: 'static> Wired<T> {
    pub(crate) const fn new(unwired: T) -> Self {
        Wired {
            cell: OnceLock::new(),
            unwired,
        }
    }

    /// Wire it (once; a second call changes nothing).
    pub(crate) fn set(&self, v: T) {
        let _ = self.cell.set(v);
    }

    /// The wired value, else the unwired one.
    #[inline]
    pub(crate) fn get(&self) -> &T {
        self.cell.get().unwrap_or(&self.unwired)
    }
}
