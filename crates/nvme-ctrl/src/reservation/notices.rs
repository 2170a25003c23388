//! One controller's Reservation Notification log (LID 80h) and the masks its
//! host set (Reservation Notification Mask): what the admin side fills from the
//! notifications the shared state owes this controller.

use std::collections::VecDeque;

use nvme_spec::resv::{notification, notify_mask, ReservationNotificationLog};
use zerocopy::little_endian::{U32, U64};
use zerocopy::FromZeros;

/// Most notifications this controller keeps unread (older ones are dropped, as
/// the spec lets a controller do: the count shows the gap).
const MAX_UNREAD: usize = 255;

/// This controller's Reservation Notification log.
#[derive(Debug, Default)]
pub struct NotificationLog {
    unread: VecDeque<(u8, u32)>,
    /// Log Page Count of the last entry made (0 is skipped when it wraps).
    count: u64,
    /// Namespaces' masks (Reservation Notification Mask), by NSID.
    masks: std::collections::BTreeMap<u32, u32>,
    /// Some namespace has reservations: look for notifications.
    watching: bool,
}

impl NotificationLog {
    /// Looks for notifications from now on (`on`: some namespace has
    /// reservations), or not.
    pub(crate) fn watch(&mut self, on: bool) {
        self.watching = on;
    }

    pub(crate) fn set_mask(&mut self, nsid: u32, mask: u32) {
        self.masks.insert(nsid, mask);
    }

    /// Every namespace's mask, by NSID (for a hand-over).
    pub(crate) fn masks(&self) -> Vec<(u32, u32)> {
        self.masks.iter().map(|(&n, &m)| (n, m)).collect()
    }

    pub(crate) fn mask(&self, nsid: u32) -> Option<u32> {
        self.masks.get(&nsid).copied()
    }

    pub(crate) fn watching(&self) -> bool {
        self.watching
    }

    pub(crate) fn push(&mut self, kind: u8, nsid: u32) {
        self.count = self.count.checked_add(1).unwrap_or(1);
        self.unread.push_back((kind, nsid));
        if self.unread.len() > MAX_UNREAD {
            self.unread.pop_front();
        }
    }

    /// The next entry (an empty one when none is unread), left in place.
    pub(crate) fn peek(&self) -> ReservationNotificationLog {
        let mut e = ReservationNotificationLog::new_zeroed();
        if let Some(&(kind, nsid)) = self.unread.front() {
            e.count = U64::new(self.count - (self.unread.len() as u64 - 1));
            e.kind = kind;
            e.nsid = U32::new(nsid);
            e.available = (self.unread.len() - 1).min(255) as u8;
        }
        e
    }

    /// The host read the next entry: it goes.
    pub(crate) fn taken(&mut self) {
        self.unread.pop_front();
    }

    pub(crate) fn masked(&self, nsid: u32, kind: u8) -> bool {
        let bit = match kind {
            notification::REGISTRATION_PREEMPTED => notify_mask::REGISTRATION_PREEMPTED,
            notification::RESERVATION_RELEASED => notify_mask::RESERVATION_RELEASED,
            _ => notify_mask::RESERVATION_PREEMPTED,
        };
        self.masks.get(&nsid).is_some_and(|m| m & bit != 0)
    }
}
