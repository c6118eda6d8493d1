"""Text the benchmark workloads are built from: original passages, questions and instructions.

Written for this project (no third-party text), varied on purpose: everyday topics, science,
history, code, and small practical tasks, so prompts tokenize like real chat traffic rather
than like repeated filler. Kept as Python data so it ships with the package without package-data
configuration.
"""
from __future__ import annotations

SYSTEM_PROMPTS = [
    "You are a helpful assistant. Answer clearly and keep your replies short.",
    "You are a patient tutor who explains ideas step by step with small examples.",
    "You are a concise technical assistant. Prefer lists and concrete numbers.",
    "You are a friendly travel and cooking guide. Be practical and specific.",
    "You are an editor. Improve the text you are given without changing its meaning.",
]

# (topic, passage): each passage is a handful of sentences on one subject.
PASSAGES = [
    ("sourdough", "A sourdough starter is a living culture of wild yeast and lactic acid bacteria kept in "
     "a jar of flour and water. Each feeding dilutes the acids and gives the microbes fresh starch to eat. "
     "When the starter doubles within four to six hours of a feeding, it is strong enough to raise a loaf. "
     "Bakers who forget to feed it for a week usually find a grey liquid on top, which smells sharp but is "
     "harmless. Pouring it off and feeding the starter twice a day brings it back within a couple of days."),
    ("tides", "Tides are caused mostly by the Moon pulling harder on the side of the Earth that faces it than "
     "on the far side. The difference stretches the oceans into two bulges, so most coasts see two high tides "
     "a day. When the Sun and the Moon line up, at new and full moon, their pulls add and the tides are larger; "
     "these are called spring tides. Halfway between, the pulls partly cancel and the range is smaller. Local "
     "geography matters a great deal: a narrow bay can funnel the water into a range of many meters."),
    ("git", "A Git branch is only a movable pointer to a commit. Creating one costs almost nothing, which is "
     "why teams open a branch for every change. When you merge, Git finds the common ancestor of the two tips "
     "and combines the changes made on each side since then. A rebase instead replays your commits on top of "
     "another branch, giving a straight history but new commit ids. Rebasing commits that others have already "
     "pulled forces them to reconcile the rewritten history, so most teams rebase only private work."),
    ("bees", "A honeybee colony in summer may hold forty thousand workers, a few hundred drones and a single "
     "queen. Young workers clean cells and feed larvae; older ones build comb, guard the entrance and finally "
     "forage. Foragers share the location of good flowers with the waggle dance, in which the angle of the run "
     "encodes the direction relative to the Sun and its length encodes the distance. In autumn the colony "
     "shrinks, the drones are pushed out, and the remaining bees cluster together to keep the queen warm."),
    ("compound-interest", "Compound interest means earning interest on past interest. At five percent a year, "
     "one thousand dollars becomes about one thousand six hundred and twenty-nine dollars after ten years, "
     "not one thousand five hundred. A handy rule of thumb is the rule of seventy-two: divide seventy-two by the "
     "yearly rate to estimate how many years it takes to double. The same arithmetic works against you on debt, "
     "which is why a credit card balance at twenty percent grows so quickly if only the minimum is paid."),
    ("volcanoes", "Volcanoes form where molten rock reaches the surface, mostly along the edges of tectonic "
     "plates. Where an ocean plate dives beneath another plate, water released from the sinking slab lowers "
     "the melting point of the mantle above it, and the sticky, gas-rich magma that results tends to erupt "
     "explosively. At spreading ridges and hot spots such as Hawaii, the magma is runnier and flows out as "
     "lava rivers. Scientists watch for swelling ground, small earthquakes and changes in gas to forecast eruptions."),
    ("printing-press", "Before movable type, a book in Europe was copied by hand, and a large one could take a "
     "scribe more than a year. Around 1450 Johannes Gutenberg combined metal type cast in a hand mold, an "
     "oil-based ink and a screw press adapted from wine making. A small shop could now print hundreds of copies "
     "in the time a scribe produced one. Within fifty years presses were running in more than two hundred "
     "cities, and cheap pamphlets carried news, arguments and religious debates faster than any ruler could "
     "stop them."),
    ("python-lists", "In Python, a list stores references to objects in a resizable array. Appending is fast on "
     "average because the array grows by more than one slot at a time, but inserting at the front shifts every "
     "element and costs time proportional to the length. When you need to add and remove items at both ends, "
     "collections.deque is the better choice. Sorting a list with sort() changes it in place and returns None, "
     "while sorted() returns a new list and leaves the original alone; mixing the two up is a classic bug."),
    ("sleep", "Sleep is not a single state. Through the night the brain cycles roughly every ninety minutes "
     "between light sleep, deep slow-wave sleep and rapid eye movement sleep, when most vivid dreams happen. "
     "Deep sleep dominates the first half of the night and REM the second, so cutting a night short mostly costs "
     "REM. Adults who regularly sleep less than seven hours show slower reaction times, even when they feel fine. "
     "A dark, cool room and a regular wake-up time help more than most gadgets."),
    ("bicycle-gears", "A bicycle's gear ratio is the number of teeth on the front chainring divided by the number "
     "on the rear cog. A large ratio moves the bike far with each turn of the pedals, which suits flat roads and "
     "high speed. A small ratio makes each turn easier but slower, which is what you want on a steep hill. Riders "
     "usually aim for a steady pedaling rate of seventy to ninety turns a minute and change gears to keep it. "
     "Shifting under heavy load wears the chain, so it helps to ease off the pedals for a moment while shifting."),
    ("tomatoes", "Tomatoes need warmth, sun and steady water. Planting them deep, with part of the stem buried, "
     "lets the plant grow extra roots along the stem. Watering irregularly causes blossom end rot, a dark sunken "
     "patch at the bottom of the fruit, because calcium cannot reach the fruit fast enough. Cracked skins usually "
     "follow a heavy rain after a dry spell. Pinching off the side shoots of tall varieties concentrates energy "
     "in fewer, larger fruits, while bush varieties are best left alone."),
    ("http-caching", "HTTP caching lets a browser reuse a response instead of downloading it again. The server "
     "sends a Cache-Control header saying how long the response stays fresh. After that, the browser can ask "
     "whether it changed by sending the ETag it received earlier; if nothing changed, the server answers 304 Not "
     "Modified with an empty body. Static files such as scripts and images are often given a long lifetime and a "
     "file name that contains a hash of their content, so a new version simply gets a new name."),
    ("roman-roads", "The Romans built more than eighty thousand kilometers of paved roads. A typical road had "
     "layers: large stones at the bottom, then gravel and sand, then fitted paving stones on top, with a slight "
     "curve so rain ran off to ditches at the sides. Milestones told travelers the distance to the next town. "
     "The roads moved armies quickly, but they also carried merchants, letters and ideas, and many modern "
     "European highways still follow their routes."),
    ("photosynthesis", "Plants capture sunlight with chlorophyll, a pigment that absorbs red and blue light and "
     "reflects green, which is why leaves look green. The energy splits water molecules, releasing oxygen as a "
     "by-product, and is stored in short-lived carrier molecules. In a second stage, the plant uses those carriers "
     "to fix carbon dioxide from the air into sugars. Only a few percent of the sunlight that falls on a field ends "
     "up stored in the crop, yet that small fraction feeds nearly every living thing on land."),
    ("sql-index", "A database index works like the index at the back of a book: instead of scanning every row, the "
     "database looks up the value in a sorted structure, usually a B-tree, and jumps to the matching rows. Indexes "
     "make reads faster but every insert and update must also update them, so adding an index to every column "
     "slows writes and wastes space. A composite index on two columns helps queries that filter on the first "
     "column or on both, but not queries that filter only on the second."),
    ("coffee", "Coffee extraction depends on grind size, water temperature and contact time. Water that is too "
     "cool or a grind that is too coarse under-extracts the beans, giving a sour, thin cup. Too fine a grind or "
     "too long a brew pulls out bitter compounds. Most brewing guides suggest water just off the boil, around "
     "ninety to ninety-six degrees Celsius, and about sixty grams of coffee per liter of water. Freshly ground "
     "beans matter more than expensive equipment, because ground coffee loses its aroma within an hour or two."),
    ("black-holes", "A black hole forms when so much mass is squeezed into a small enough region that nothing, not "
     "even light, can escape from inside a boundary called the event horizon. Stellar black holes are left behind "
     "when very massive stars collapse at the end of their lives. Supermassive ones, millions or billions of times "
     "the mass of the Sun, sit at the centers of most large galaxies. We cannot see the hole itself, but we can "
     "see hot gas swirling around it and stars orbiting something massive and invisible."),
    ("negotiation", "In a negotiation, the most useful number to know is your best alternative if no deal is "
     "reached. It sets the point below which you should walk away, and it keeps you calm when the other side "
     "pushes. Opening offers anchor the discussion, so a well-researched first number often shapes the outcome. "
     "Asking why the other side wants something can reveal interests that can be met in cheaper ways than the "
     "position they started with, such as a flexible start date instead of a higher salary."),
    ("vaccines", "A vaccine trains the immune system by showing it a harmless version or piece of a germ. The body "
     "responds by making antibodies and memory cells that recognize that target. If the real germ arrives later, "
     "the memory cells respond within days instead of weeks, often before the person feels ill. Some vaccines need "
     "boosters because memory fades or because the germ changes over time. When enough people are immune, a germ "
     "struggles to spread, which also protects those who cannot be vaccinated."),
    ("unit-tests", "A good unit test checks one behavior, runs in milliseconds and fails with a message that points "
     "at the cause. Tests that depend on the clock, the network or the order in which they run tend to fail at "
     "random, and a team soon learns to ignore them. Writing the test before fixing a bug proves that the test "
     "can actually catch the bug. Aim tests at behavior that users rely on rather than at private details, so "
     "that refactoring the code does not require rewriting every test."),
    ("glaciers", "A glacier forms where more snow falls each winter than melts each summer. Over years the snow is "
     "compressed into dense ice, which starts to flow slowly downhill under its own weight. As it moves, it plucks "
     "rocks from the bed and grinds them along, carving U-shaped valleys and leaving piles of debris called "
     "moraines. Many glaciers are now shrinking, and the meltwater they provide to rivers in dry summers will "
     "decline once the ice is gone."),
    ("budget-travel", "Traveling on a budget is mostly about timing and flexibility. Flights in the middle of the "
     "week and outside school holidays are usually cheaper, and flying into a secondary airport can save more than "
     "the extra bus ride costs. Staying in a neighborhood one metro stop away from the center cuts the price of a "
     "room while keeping sights within reach. Eating the main meal at lunch, when many restaurants offer set "
     "menus, gives you good food for much less than the same dishes at dinner."),
    ("rust-ownership", "Rust manages memory without a garbage collector through ownership. Each value has one owner, "
     "and when the owner goes out of scope the value is freed. You can lend a value out by reference: any number of "
     "shared references, or exactly one mutable reference, but not both at once. The compiler checks these rules "
     "before the program runs, which rules out whole classes of bugs such as using freed memory or two threads "
     "writing the same data at the same time."),
    ("chess-openings", "Chess openings follow a few principles more than memorized lines. Control the center with "
     "pawns and pieces, develop knights and bishops before moving the same piece twice, and castle early to keep "
     "the king safe. Bringing the queen out too soon lets the opponent gain time by attacking it. Beginners gain "
     "more from studying tactics, such as forks and pins, than from learning long opening variations they will "
     "not understand once the opponent leaves the book."),
    ("electric-cars", "An electric car converts most of the energy in its battery into motion, while a petrol engine "
     "turns most of its fuel into heat. Regenerative braking recovers some energy when slowing down, which is why "
     "electric cars do comparatively well in city traffic. Range drops in cold weather because the battery chemistry "
     "slows and the cabin must be heated. Fast chargers can refill most of a battery in half an hour, but charging "
     "slows sharply above about eighty percent to protect the cells."),
    ("music-scales", "A major scale is built from a fixed pattern of whole and half steps: whole, whole, half, whole, "
     "whole, whole, half. Starting that pattern on any note gives that note's major scale, which is why C major uses "
     "only white keys on a piano while G major needs one sharp. The natural minor scale uses a different pattern "
     "and sounds darker. Chords are stacked from every other note of a scale, so knowing the scale tells you which "
     "chords belong to a key."),
    ("composting", "Composting turns kitchen and garden waste into a dark, crumbly soil conditioner. Microbes do the "
     "work, and they need a mix of nitrogen-rich greens, such as vegetable scraps and grass clippings, and "
     "carbon-rich browns, such as dry leaves and cardboard. A pile that smells bad is usually too wet or has too many "
     "greens; adding browns and turning it lets air back in. A well-managed pile gets warm in the middle and can be "
     "ready in two to three months."),
    ("cache-memory", "A modern processor can do arithmetic far faster than main memory can deliver data, so it keeps "
     "recently used data in small, fast caches close to the cores. Reading from the first-level cache takes a few "
     "cycles; reading from main memory takes hundreds. Programs that walk through arrays in order let the hardware "
     "prefetch the next lines before they are needed. Programs that jump around memory, such as those following "
     "long chains of pointers, spend much of their time waiting."),
    ("lighthouses", "Lighthouses marked dangerous coasts long before satellites. Each one flashes its own pattern, "
     "such as two short flashes every ten seconds, so sailors can tell which light they are looking at from a chart. "
     "The Fresnel lens, made of rings of glass prisms, gathered the light of a single lamp into a beam visible "
     "more than thirty kilometers away. Most lighthouses are now automated, and keepers who once trimmed wicks and "
     "wound clockwork through the night have moved on to other jobs."),
    ("running", "New runners often get hurt by increasing their weekly distance too quickly. A common guideline is to "
     "add no more than about ten percent per week and to make every fourth week easier. Most runs should be at a "
     "conversational pace, where you could speak in full sentences, with only a small share of hard efforts. "
     "Shoes matter less than a gradual build-up, but replacing them after several hundred kilometers keeps the "
     "cushioning from wearing out unnoticed."),
]

QUESTIONS = [
    "What is the difference between weather and climate?",
    "How do I keep basil alive on a windowsill?",
    "Can you explain what a hash table is and why lookups are fast?",
    "Why is the sky blue during the day but red at sunset?",
    "What should I pack for a three-day hiking trip in the mountains?",
    "How does a refrigerator move heat from inside to outside?",
    "Write a short poem about a cat watching rain.",
    "What are three good habits for writing readable code?",
    "How long should I boil an egg if I want a soft yolk?",
    "Why do onions make people cry when they are cut?",
    "What is the difference between a virus and a bacterium?",
    "Give me a simple weekly plan to start learning Spanish.",
    "How does public key cryptography let two strangers share a secret?",
    "What causes the seasons on Earth?",
    "Suggest a name for a small bakery that sells bread and coffee.",
    "How can I explain fractions to a seven-year-old?",
    "What is a recursive function? Show a tiny example.",
    "Why do cats purr?",
    "What is inflation and why do central banks care about it?",
    "How do noise-cancelling headphones work?",
    "Write an email asking my landlord to fix a leaking tap.",
    "Is it better to stretch before or after running?",
    "What was the main cause of the fall of the Western Roman Empire?",
    "How do airplanes stay in the air?",
    "Explain the difference between RAM and disk storage.",
    "What are some easy vegetarian dinners for a busy week?",
    "How do I calculate the area of a circle with a radius of 4 cm?",
    "Why does ice float on water?",
    "What is a good way to prepare for a job interview?",
    "Translate 'Where is the train station?' into French and German.",
    "How does a search engine decide which pages to show first?",
    "What is the difference between latency and throughput?",
    "Why do leaves change color in autumn?",
    "How can I make my phone battery last longer?",
    "Summarize the plot of a typical detective story in three sentences.",
    "What are the pros and cons of working from home?",
    "How does the stock market work, in simple terms?",
    "Why is it important to sleep well before an exam?",
    "What does a compiler do?",
    "How do birds know where to fly when they migrate?",
]

# Instructions that wrap a passage; {text} is replaced by one or more passage sentences.
TASKS = [
    "Summarize the following text in two sentences:\n\n{text}",
    "Read this passage and list its three most important points:\n\n{text}",
    "Explain the following to a twelve-year-old:\n\n{text}",
    "{text}\n\nBased on the text above, what is one common mistake people make?",
    "Rewrite this paragraph so it is easier to read:\n\n{text}",
    "Here are my notes:\n{text}\n\nTurn them into three quiz questions with answers.",
    "{text}\n\nIs anything in this paragraph wrong or misleading? Explain briefly.",
    "Give this text a short, catchy title and a one-line summary:\n\n{text}",
]

FOLLOW_UPS = [
    "Thanks. Can you give me a concrete example?",
    "Could you make that shorter?",
    "What would you do differently if you were starting today?",
    "Interesting. What is the most surprising part of that?",
    "Can you put that into a numbered list?",
    "How would this apply to a beginner?",
]

# A support handbook for a fictional company: the long common system prompt of the shared-prefix workload.
HANDBOOK_TITLE = "Support handbook for Northwind Cycles, an online shop selling bicycles, parts and repairs."
HANDBOOK = [
    "You answer customer questions for Northwind Cycles. Be polite, brief and accurate. If the handbook does not "
    "cover a question, say so and offer to pass it to a human colleague.",
    "Orders: orders placed before two in the afternoon on a working day ship the same day. Standard delivery "
    "takes three to five working days and is free above fifty euros; express delivery takes one to two working "
    "days and costs nine euros. Customers receive a tracking link by email when the parcel leaves the warehouse.",
    "Returns: unused items can be returned within thirty days in their original packaging. Bicycles must not have "
    "been ridden outdoors. The customer pays return shipping unless the item arrived damaged or was the wrong item. "
    "Refunds go back to the original payment method within five working days of the return arriving.",
    "Warranty: frames carry a five-year warranty against manufacturing defects; components carry two years. Wear "
    "parts such as tyres, brake pads and chains are not covered. Crash damage is not covered, but crash "
    "replacement offers a new frame at forty percent off the list price within the warranty period.",
    "Repairs: the workshop offers a basic service for forty-five euros, covering gear and brake adjustment, wheel "
    "truing and a safety check, and a full service for one hundred and ten euros that adds cleaning the drivetrain "
    "and replacing cables. Booking is online; most bikes are ready within two working days.",
    "Sizing: frame size depends mostly on the rider's inside leg length. Road frames in centimeters are roughly "
    "the inside leg multiplied by 0.67; mountain bike sizes in inches are roughly the inside leg in centimeters "
    "multiplied by 0.226. Customers between two sizes should usually choose the smaller frame for control.",
    "Electric bikes: batteries ship only by ground transport, so express delivery is not available for them. "
    "A full charge takes four to six hours. Range depends on assist level, terrain and rider weight, typically "
    "forty to one hundred kilometers. Batteries should be stored half charged if the bike is unused for weeks.",
    "Payments: the shop accepts cards, bank transfer and payment in three instalments for orders above three "
    "hundred euros. Prices include VAT. Gift cards never expire and can be combined with other payment methods, "
    "but discount codes cannot be combined with each other.",
    "Tone: address the customer by name when it is known, never promise dates the handbook does not support, and "
    "end by asking whether there is anything else you can help with.",
]

HANDBOOK_QUESTIONS = [
    "My order hasn't arrived after a week. What should I do?",
    "Can I return a helmet I bought three weeks ago?",
    "Is a cracked frame covered after two years?",
    "How much is a full service and what does it include?",
    "I'm 182 cm with an 86 cm inside leg. Which road frame size fits me?",
    "Can I get express delivery on an e-bike?",
    "Can I use two discount codes on one order?",
    "How long does the e-bike battery take to charge?",
    "Do you ship on Saturdays?",
    "My new brake pads wore out after a month. Is that under warranty?",
    "Can I pay in instalments for a 250 euro order?",
    "The wrong saddle arrived. Who pays for sending it back?",
    "How should I store my e-bike over the winter?",
    "When will I get my refund after returning a bike?",
    "I crashed and bent my frame. Are there any discounts on a new one?",
    "Do gift cards expire?",
]
