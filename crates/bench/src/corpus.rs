//! A small built-in English text. With a server-side tokenizer the client cannot see the
//! vocabulary, so it learns a set of ordinary token ids by tokenizing this text; without any
//! tokenizer its words build approximate prompts.

pub const CORPUS: &str = "\
The river ran quietly past the old mill, where a miller once ground wheat and barley for the \
village. Each morning the baker collected fresh flour, and by noon the smell of warm bread \
drifted across the square. Children chased pigeons between market stalls selling apples, \
cheese, honey, candles, wool and copper pots. In the evening, lanterns were lit along the \
bridge and musicians played until the last traveller had found a bed at the inn.
Modern computers process enormous amounts of information every second. A processor fetches \
instructions from memory, decodes them, executes arithmetic or logical operations, and writes \
results back to registers. Caches keep recently used data close to the cores, because reading \
from main memory takes hundreds of cycles. Parallel programs split work across threads, while \
careful engineers measure latency, throughput and energy before changing a design.
Weather forecasts combine satellite images, radar measurements and numerical models of the \
atmosphere. Meteorologists study pressure systems, humidity, temperature gradients and wind \
patterns to predict storms several days ahead. Farmers, pilots, sailors and event organizers \
depend on accurate predictions; a sudden frost can destroy a harvest, and fog may close an \
airport for hours.
Learning a new language requires patience and practice. Students memorize vocabulary, \
conjugate verbs, listen to native speakers and gradually build confidence in conversation. \
Reading novels, newspapers and poetry reveals idioms that textbooks rarely explain. Travel \
helps too: ordering dinner, asking for directions or bargaining at a market quickly turns \
theory into habit.
The museum opened a new exhibition about ancient navigation. Visitors examined wooden ships, \
brass astrolabes, hand-drawn maps and journals describing voyages across unknown oceans. \
Sailors once steered by the stars, estimated speed with a knotted rope, and recorded every \
observation in a logbook. Their courage, curiosity and skill expanded the known world.
Healthy habits include regular exercise, balanced meals, enough sleep and time spent outdoors. \
Doctors recommend walking, cycling or swimming several times a week, drinking water instead \
of sugary beverages, and eating vegetables, fruit, grains, beans and fish. Small consistent \
changes often matter more than dramatic resolutions that fade after a month.
Mathematics describes patterns: numbers, shapes, probabilities and change. Geometry measures \
angles and areas, algebra manipulates symbols, calculus studies rates and accumulation, and \
statistics draws conclusions from noisy samples. Engineers, economists, biologists and \
musicians all rely on these tools, sometimes without noticing.
A good story needs characters who want something, obstacles that stand in their way, and \
choices that reveal who they are. Writers revise drafts many times, cutting scenes, sharpening \
dialogue and checking that every chapter moves the plot forward. Readers remember the moments \
when a character surprises them yet still feels true.
Numbers and symbols: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 2026 3.14 -7 +5 = < > ( ) [ ] { } \
# $ % & * / \\ | ~ ^ @ ; : , . ! ? ' \" _ 
Names and places: Alice, Bob, Carol, David, Erin, Frank, Grace, Heidi, Ivan, Judy, London, \
Paris, Tokyo, Nairobi, Lima, Oslo, Sydney, Toronto, Cairo, Mumbai, Berlin, Madrid, Seoul.";

/// The corpus split into words (punctuation kept attached).
pub fn words() -> Vec<&'static str> {
    CORPUS.split_whitespace().collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn corpus_has_many_distinct_words() {
        let mut distinct = super::words();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 400, "{}", distinct.len());
    }
}
