/**
 * HTTP's field grammar (RFC 9110 §5.1, §5.5, §5.6.2) as regexp pieces, for every place that
 * writes or checks a head by hand: the raw front's request parser and answers
 * (src/server/front/), the upstream client's requests and answer parser (src/transport/http1/).
 */

/** `tchar`, a token's characters, as the body of a regexp character class. */
export const TCHAR = "!#$%&'*+\\-.^_`|~0-9A-Za-z";
/** A field value's characters (HTAB, SP, VCHAR, obs-text), as the body of a character class. */
export const FIELD_VCHAR = "\\t\\x20-\\x7e\\x80-\\xff";

/** A whole token (a field name, a method). */
export const TOKEN = new RegExp(`^[${TCHAR}]+$`);
/** A whole field value: no control byte but HTAB, so no CR or LF that could split a head. */
export const FIELD_VALUE = new RegExp(`^[${FIELD_VCHAR}]*$`);
