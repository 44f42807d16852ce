//! `strftime_now(format)`, the one function transformers adds to a chat template's jinja
//! beside `raise_exception`: templates write today's date with it (gpt-oss's system message,
//! Llama 3.x's "Today Date"). UTC, where transformers takes the machine's local time: a
//! daemon's clock zone is rarely the user's anyway, and UTC keeps two daemons alike.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A moment as the calendar names it (UTC).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Civil {
    pub year: i64,
    /// 1..=12.
    pub month: u32,
    /// 1..=31.
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Monday.
    pub weekday: u32,
    /// 1..=366.
    pub yday: u32,
}

impl Civil {
    /// The moment `secs` seconds after the Unix epoch (Howard Hinnant's civil_from_days).
    pub fn from_unix(secs: i64) -> Civil {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
        const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let yday = BEFORE[month as usize - 1] + day + u32::from(leap && month > 2);
        Civil {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
            // 1970-01-01 was a Thursday.
            weekday: (days + 3).rem_euclid(7) as u32,
            yday,
        }
    }

    pub fn now() -> Civil {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        Civil::from_unix(secs)
    }

    /// `format` with Python's (C's) directives for the date and time of day; an unknown
    /// directive is written as it stands, as glibc does.
    pub fn format(&self, format: &str) -> String {
        let mut out = String::with_capacity(format.len() + 16);
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let month = MONTHS[self.month as usize - 1];
            let weekday = DAYS[self.weekday as usize];
            match chars.next() {
                Some('Y') => out.push_str(&self.year.to_string()),
                Some('y') => out.push_str(&format!("{:02}", self.year.rem_euclid(100))),
                Some('m') => out.push_str(&format!("{:02}", self.month)),
                Some('d') => out.push_str(&format!("{:02}", self.day)),
                Some('e') => out.push_str(&format!("{:2}", self.day)),
                Some('j') => out.push_str(&format!("{:03}", self.yday)),
                Some('H') => out.push_str(&format!("{:02}", self.hour)),
                Some('I') => out.push_str(&format!("{:02}", (self.hour + 11) % 12 + 1)),
                Some('p') => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                Some('M') => out.push_str(&format!("{:02}", self.minute)),
                Some('S') => out.push_str(&format!("{:02}", self.second)),
                Some('B') => out.push_str(month),
                Some('b') | Some('h') => out.push_str(&month[..3]),
                Some('A') => out.push_str(weekday),
                Some('a') => out.push_str(&weekday[..3]),
                Some('u') => out.push_str(&(self.weekday + 1).to_string()),
                Some('w') => out.push_str(&((self.weekday + 1) % 7).to_string()),
                Some('F') => out.push_str(&self.format("%Y-%m-%d")),
                Some('T') => out.push_str(&self.format("%H:%M:%S")),
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    out.push(other);
                }
                None => out.push('%'),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against Python's `datetime.fromtimestamp(secs, timezone.utc).strftime(...)`.
    #[test]
    fn dates_format_as_pythons_strftime() {
        let fmt = "%Y-%m-%d %H:%M:%S|%d %b %Y|%A %B %e|%j %y %I%p %a %u %w %F %T %% %q";
        for (secs, want) in [
            (
                0,
                "1970-01-01 00:00:00|01 Jan 1970|Thursday January  1|001 70 12AM Thu 4 4 1970-01-01 00:00:00 % %q",
            ),
            (
                951_825_600, // 2000-02-29 12:00:00, a leap day
                "2000-02-29 12:00:00|29 Feb 2000|Tuesday February 29|060 00 12PM Tue 2 2 2000-02-29 12:00:00 % %q",
            ),
            (
                1_796_601_599, // 2026-12-06 23:59:59, a Sunday
                "2026-12-06 23:59:59|06 Dec 2026|Sunday December  6|340 26 11PM Sun 7 0 2026-12-06 23:59:59 % %q",
            ),
            (
                1_924_991_999, // 2030-12-31 23:59:59
                "2030-12-31 23:59:59|31 Dec 2030|Tuesday December 31|365 30 11PM Tue 2 2 2030-12-31 23:59:59 % %q",
            ),
        ] {
            assert_eq!(Civil::from_unix(secs).format(fmt), want, "{secs}");
        }
    }
}
