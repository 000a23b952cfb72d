// Output helpers shared by the demo's clients.

// say(text): text wrapped to 78 columns, indented by two spaces.
export function say(text) {
    let line = ' ';
    for (const word of text.split(' ')) {
        if (line.length + 1 + word.length > 78 && line.trim()) {
            console.log(line);
            line = ' ';
        }
        line += ` ${word}`;
    }
    console.log(line);
}
