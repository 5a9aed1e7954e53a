// The date generator: civil-calendar arithmetic, true weekdays, and the fifteen written forms.
#include "attn/seq2seq/dates.hpp"

#include <array>
#include <string>

#include "attn/core/error.hpp"
#include "attn/core/random.hpp"

namespace attn {

namespace {

const std::array<const char*, 12> kMonths = {"january",   "february", "march",    "april",
                                             "may",       "june",     "july",     "august",
                                             "september", "october",  "november", "december"};
const std::array<const char*, 12> kMonthAbbreviations = {"jan", "feb", "mar", "apr", "may", "jun",
                                                         "jul", "aug", "sep", "oct", "nov", "dec"};
const std::array<const char*, 7> kWeekdays = {"monday", "tuesday",  "wednesday", "thursday",
                                              "friday", "saturday", "sunday"};
const std::array<const char*, 7> kWeekdayAbbreviations = {"mon", "tue", "wed", "thu",
                                                          "fri", "sat", "sun"};

struct CivilDate {
  int year, month, day;
};

// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
int64_t days_from_civil(int year, int month, int day) {
  const int y = year - (month <= 2 ? 1 : 0);
  const int era = (y >= 0 ? y : y - 399) / 400;
  const int year_of_era = y - era * 400;
  const int day_of_year = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1;
  const int day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
  return static_cast<int64_t>(era) * 146097 + day_of_era - 719468;
}

CivilDate civil_from_days(int64_t days) {
  const int64_t z = days + 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t day_of_era = z - era * 146097;
  const int64_t year_of_era =
      (day_of_era - day_of_era / 1460 + day_of_era / 36524 - day_of_era / 146096) / 365;
  const int64_t day_of_year =
      day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
  const int64_t mp = (5 * day_of_year + 2) / 153;
  const int day = static_cast<int>(day_of_year - (153 * mp + 2) / 5 + 1);
  const int month = static_cast<int>(mp < 10 ? mp + 3 : mp - 9);
  const int year = static_cast<int>(year_of_era + era * 400 + (month <= 2 ? 1 : 0));
  return {year, month, day};
}

std::string two_digits(int value) {
  return std::string(1, static_cast<char>('0' + value / 10)) + static_cast<char>('0' + value % 10);
}

std::string ordinal(int day) {
  const char* suffix = "th";
  if (day % 10 == 1 && day != 11) suffix = "st";
  if (day % 10 == 2 && day != 12) suffix = "nd";
  if (day % 10 == 3 && day != 13) suffix = "rd";
  return std::to_string(day) + suffix;
}

int64_t total_days() {
  return days_from_civil(kLastDateYear + 1, 1, 1) - days_from_civil(kFirstDateYear, 1, 1);
}

}  // namespace

TextPair write_date(int64_t days, int format) {
  if (days < 0 || days >= total_days()) {
    throw ValueError("days: expected a day in [0, " + std::to_string(total_days()) +
                     ") since 1950-01-01, got " + std::to_string(days));
  }
  if (format < 0 || format >= kDateFormats) {
    throw ValueError("format: expected a form in [0, " + std::to_string(kDateFormats) + "), got " +
                     std::to_string(format));
  }
  const int64_t epoch_days = days_from_civil(kFirstDateYear, 1, 1) + days;
  const CivilDate date = civil_from_days(epoch_days);
  // 1970-01-01 was a Thursday (index 3 from Monday).
  const auto weekday = static_cast<size_t>(((epoch_days % 7) + 7 + 3) % 7);
  const std::string d = std::to_string(date.day), dd = two_digits(date.day);
  const std::string mm = two_digits(date.month), yyyy = std::to_string(date.year),
                    yy = two_digits(date.year % 100);
  const std::string month = kMonths[static_cast<size_t>(date.month - 1)];
  const std::string mon = kMonthAbbreviations[static_cast<size_t>(date.month - 1)];
  const std::string weekday_name = kWeekdays[weekday];
  const std::string wkd = kWeekdayAbbreviations[weekday];
  std::string source;
  switch (format) {
    case 0:
      source = d + " " + month + " " + yyyy;
      break;
    case 1:
      source = weekday_name + ", " + month + " " + d + ", " + yyyy;
      break;
    case 2:
      source = mm + "/" + dd + "/" + yy;
      break;
    case 3:
      source = month + " " + d + ", " + yyyy;
      break;
    case 4:
      source = d + " " + mon + " " + yyyy;
      break;
    case 5:
      source = mon + " " + d + " " + yyyy;
      break;
    case 6:
      source = ordinal(date.day) + " of " + month + " " + yyyy;
      break;
    case 7:
      source = dd + "." + mm + "." + yyyy;
      break;
    case 8:
      source = wkd + " " + d + " " + month + " " + yyyy;
      break;
    case 9:
      source = month + " " + ordinal(date.day) + ", " + yy;
      break;
    case 10:
      source = "the " + ordinal(date.day) + " of " + month + ", " + yyyy;
      break;
    case 11:
      source = yyyy + "/" + mm + "/" + dd;
      break;
    case 12:
      source = mon + ". " + d + ", " + yyyy;
      break;
    case 13:
      source = weekday_name + " " + d + " " + mon + " " + yy;
      break;
    default:
      source = d + "-" + mon + "-" + yyyy;
      break;
  }
  return {source, yyyy + "-" + mm + "-" + dd};
}

std::vector<TextPair> generate_date_pairs(int64_t count, uint64_t seed) {
  if (count < 0)
    throw ValueError("count: expected a non-negative number of dates, got " +
                     std::to_string(count));
  Rng rng(seed);
  const auto days = static_cast<uint64_t>(total_days());
  std::vector<TextPair> pairs;
  pairs.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const auto day = static_cast<int64_t>(rng.next_u64() % days);
    const auto format = static_cast<int>(rng.next_u64() % kDateFormats);
    pairs.push_back(write_date(day, format));
  }
  return pairs;
}

}  // namespace attn
